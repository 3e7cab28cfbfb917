"""The audit's settings and seeds: one place for sample sizes, test levels and stream derivation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAD = -1  # token slot after EOS ended a continuation
REFERENCES = ("auto", "exact", "sample")
# The least each count may be (the CLI's arguments check the same bounds).
MINIMUMS = {"samples": 20, "tokens": 3, "max_enumerate": 1, "top_prefixes": 0, "bootstrap": 0, "batch_size": 1}
REFERENCE_SAMPLES_MIN = 20
# The CLI's decoder under test: the one deployed, the fast path where it runs (`speculative` names the eager reference)
DEFAULT_DECODER = "speculative:auto"


@dataclass
class AuditSettings:
    """Sample sizes and test settings; the defaults are the ones the broken variants are tested at."""

    samples: int = 4096  # continuations per prompt from the decoder under test
    tokens: int = 4  # n: tokens per continuation (>= 3; >= gamma + 2 puts a whole round in the window)
    alpha: float = 0.01  # family-wise error rate (Holm over every test of the audit)
    power: float = 0.8  # for detectable_tv
    reference: str = "auto"  # exact | sample | auto (exact when the enumeration fits)
    reference_samples: int | None = None  # sample mode: reference continuations per prompt (None: = samples)
    max_enumerate: int = 65536  # exact mode: most continuations enumerated per prompt
    top_prefixes: int = 3  # conditional tests per position
    min_expected: float = 5.0  # pool bins until every expected count reaches this
    bootstrap: int = 1000  # bootstrap resamples for the TV CI
    ci: float = 0.95
    batch_size: int = 1024  # copies of a prompt per decoder call
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in MINIMUMS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"audit.{name}={value!r}: must be an integer >= {low}")
        if self.reference_samples is not None and (
            not isinstance(self.reference_samples, int) or self.reference_samples < REFERENCE_SAMPLES_MIN
        ):
            raise ValueError(
                f"audit.reference_samples={self.reference_samples!r}: must be None or an integer >= "
                f"{REFERENCE_SAMPLES_MIN}"
            )
        if self.reference not in REFERENCES:
            raise ValueError(f"audit.reference={self.reference!r}: must be one of {list(REFERENCES)}")
        for name in ("alpha", "power", "ci"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise ValueError(f"audit.{name}={value!r}: must be in (0, 1)")
        if not self.min_expected > 0:
            raise ValueError(f"audit.min_expected={self.min_expected!r}: must be > 0")


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from a tuple of non-negative ints (independent streams per role/prompt/batch)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(2, np.uint64)[0] >> np.uint64(1))

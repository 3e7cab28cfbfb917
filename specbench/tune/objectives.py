"""Tuner objectives: one registration each (direction, unit, the paired speedup it rests on,
the study reference that scales it, and the reduction over per-unit speedups).

Every objective is a function of *paired* speedups measured on the same prompts and seeds:

* ``throughput_speedup`` units are prompt batches: spec batch tokens/s ÷ AR batch tokens/s
  (`specbench.analysis.speedup.throughput_speedup`'s per-batch ratio);
* ``latency_speedup`` units are requests: AR s/token ÷ spec s/token of the same prompt
  (`specbench.analysis.speedup.latency_speedup`'s per-request ratio).

Repeats are averaged (geometric mean) within a unit first. `reduction` maps the units'
speedups to one number; `reference` names the study's frozen AR figure that turns it into
tokens/s or s/token (``ar_tok_s``: Σ AR batch tokens ÷ Σ AR batch walls; ``ar_latency``:
median AR s/token per request). Import-light: `specbench.config` validates against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specbench.registry import Registry

SPEEDUP_KINDS = ("throughput_speedup", "latency_speedup")
REFERENCES = ("ar_tok_s", "ar_latency")


@dataclass(frozen=True)
class Objective:
    """What a trial's value means and how it is computed from paired speedups."""

    direction: str  # "maximize" | "minimize"
    unit: str  # of the value, for tables and logs
    speedup: str  # SPEEDUP_KINDS: the paired speedup whose units are reduced
    reduction: Callable[[np.ndarray], float]  # per-unit speedups (> 0) -> the value before scaling
    reference: str | None = None  # REFERENCES: study reference that multiplies the value; None: unscaled

    def __post_init__(self) -> None:
        if self.direction not in ("maximize", "minimize"):
            raise ValueError(f"direction={self.direction!r}: must be 'maximize' or 'minimize'")
        if self.speedup not in SPEEDUP_KINDS:
            raise ValueError(f"speedup={self.speedup!r}: must be one of {list(SPEEDUP_KINDS)}")
        if self.reference is not None and self.reference not in REFERENCES:
            raise ValueError(f"reference={self.reference!r}: must be None or one of {list(REFERENCES)}")


def _median(s: np.ndarray) -> float:
    return float(np.median(s))


def _mean_latency(s: np.ndarray) -> float:
    return float(np.mean(1.0 / s))  # spec s/token ÷ AR s/token, averaged over requests


def _p95_latency(s: np.ndarray) -> float:
    return float(np.percentile(1.0 / s, 95))


OBJECTIVES: Registry[Objective] = Registry("tune.objective")
OBJECTIVES.register("throughput", Objective("maximize", "tokens/s", "throughput_speedup", _median, "ar_tok_s"))
OBJECTIVES.register("throughput_speedup", Objective("maximize", "x", "throughput_speedup", _median))
OBJECTIVES.register("latency_speedup", Objective("maximize", "x", "latency_speedup", _median))
OBJECTIVES.register("latency_mean", Objective("minimize", "s/token", "latency_speedup", _mean_latency, "ar_latency"))
OBJECTIVES.register("latency_p95", Objective("minimize", "s/token", "latency_speedup", _p95_latency, "ar_latency"))


def is_better(a: float, b: float, objective: str) -> bool:
    """a beats b under the objective's direction (a NaN never wins; anything beats a NaN)."""
    if not np.isfinite(a):
        return False
    if not np.isfinite(b):
        return True
    return a > b if OBJECTIVES.get(objective).direction == "maximize" else a < b

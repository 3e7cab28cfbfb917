"""`+tune=gamma`'s settings: the Optuna studies that choose γ and the draft."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from specbench.config.checks import at_least
from specbench.decoding.policies import POLICIES
from specbench.engines import ENGINES
from specbench.models.draft_kinds import DRAFT_KINDS
from specbench.tune.objectives import OBJECTIVES
from specbench.tune.samplers import SAMPLERS

if TYPE_CHECKING:
    from specbench.config import Config


@dataclass
class TuneConfig:
    """`+tune=gamma`: choose γ (and the draft) with Optuna from real paired runs (`specbench.tune`).

    The measurement protocol is the job's (`specbench.bench.protocol`): `max_new_tokens`, `repeats`,
    `warmup`, `seed`, `batch_size` (unless `batch_sizes`), `sampling` and the workload come from the job.
    """

    enabled: bool = False
    objective: str = "throughput"  # a name in specbench.tune.objectives.OBJECTIVES
    gamma_max: int = 8  # γ is searched in [1, gamma_max]
    drafts: Optional[list[str]] = None  # draft kinds searched; None: the job's draft.kind
    # draft-length policies searched (specbench.decoding.policies; γ is then γ_max, a round's most); a policy
    # with a threshold also searches tau in [0.05, 0.95] by 0.05; `fixed` is always searched too (the yardstick the
    # recommendation pairs the best policy with). None: the job's draft.policy and draft.tau.
    policies: Optional[list[str]] = None
    n_trials: int = 8  # finished (complete + pruned) trials per study, earlier runs included
    sampler: str = "local"  # a name in specbench.tune.samplers.SAMPLERS
    stop_when_converged: bool = True  # local: stop when every neighbour of the best was measured
    prune: bool = True
    prune_after: int = 2  # prompt batches measured before a trial may be pruned (a paired test needs 2)
    prune_margin: float = 0.03  # prune only trials worse than the best by more than this, on the same batches
    prune_alpha: float = 0.05  # P(pruning a trial that is not worse by the margin), split over the looks
    batch_sizes: Optional[list[int]] = None  # one study per batch size; None: [batch_size]
    split_categories: bool = False  # one study per workload category (else one for the whole workload)
    max_prompts: Optional[int] = None  # a seeded sample of the workload per study; None: all prompts
    storage: Optional[str] = None  # None: sqlite:///<runs_dir>/tune/optuna.db; an RDB URL; journal:<path>
    study_name: Optional[str] = None  # None: derived from pair, workload, sampling, batch size, objective
    prior_sweep: Optional[str] = None  # runs/<sweep> to fit the cost model on, instead of a profile run
    profile_gamma: int = 4  # γ of the short profile run that the cost model is fitted on
    profile_batches: int = 1
    profile_max_new_tokens: Optional[int] = None  # tokens of the profile run (≤ max_new_tokens); None: max_new_tokens
    profile_ct: bool = True  # also time target forwards over k = 1..gamma_max+1 tokens (C_t(k))
    confidence: float = 0.95  # CI level; alternatives whose paired test p ≥ 1 - confidence are "indistinguishable"

    def __post_init__(self) -> None:
        OBJECTIVES.get(self.objective, "tune.objective")
        SAMPLERS.get(self.sampler, "tune.sampler")
        for name in ("gamma_max", "n_trials", "profile_gamma", "profile_batches"):
            at_least(f"tune.{name}", getattr(self, name), 1)
        at_least("tune.prune_after", self.prune_after, 2)
        for name in self.policies or []:
            if not POLICIES.get(name, "tune.policies").lossless:
                raise ValueError(f"tune.policies: {name!r} is not lossless (audit only)")
        for name in ("max_prompts", "profile_max_new_tokens"):
            at_least(f"tune.{name}", getattr(self, name), 1, nullable=True)
        if self.drafts is not None:
            drafts, kinds = list(self.drafts), DRAFT_KINDS.names()
            if not drafts:
                raise ValueError(
                    f"tune.drafts={drafts!r}: must list at least one draft kind of {kinds} "
                    "(or be null for the job's draft.kind)"
                )
            for d in drafts:
                if d not in DRAFT_KINDS:
                    raise ValueError(f"tune.drafts={drafts!r}: unknown draft kind {d!r}; allowed: {kinds}")
            if len(set(drafts)) != len(drafts):
                raise ValueError(f"tune.drafts={drafts!r}: lists a draft kind twice")
        if self.batch_sizes is not None:
            bs = list(self.batch_sizes)
            if not bs or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in bs):
                raise ValueError(f"tune.batch_sizes={bs!r}: must be null or a non-empty list of integers >= 1")
        if not 0.0 <= float(self.prune_margin) < 1.0:
            raise ValueError(f"tune.prune_margin={self.prune_margin!r}: must be in [0, 1)")
        for name in ("prune_alpha", "confidence"):
            if not 0.0 < float(getattr(self, name)) < 1.0:
                raise ValueError(f"tune.{name}={getattr(self, name)!r}: must be in (0, 1)")
        if self.storage is not None and not str(self.storage).strip():
            raise ValueError(
                f"tune.storage={self.storage!r}: must be null, an RDB URL (sqlite:///path.db) or journal:<path>"
            )

    def check(self, cfg: Config) -> None:
        """Checks that need the job config (called from `Config.__post_init__`, before any model loads)."""
        for d in self.draft_kinds(cfg):
            if DRAFT_KINDS.get(d).uses_pair_draft and not (cfg.pair.draft.source or cfg.pair.draft.shape):
                others = [k for k in DRAFT_KINDS.names() if not DRAFT_KINDS.get(k).uses_pair_draft]
                raise ValueError(
                    f"tune.drafts={self.draft_kinds(cfg)!r}: {d!r} needs pair.draft (pair "
                    f"{cfg.pair.name!r} has none); allowed for this pair: {others}"
                )
        if self.enabled and cfg.extra_decoders:
            raise ValueError(
                f"extra_decoders={list(cfg.extra_decoders)}: a tuning study measures one decoder "
                "(set decoder=...), not a comparison"
            )
        if ENGINES.get(cfg.decoder).batch_one and any(b != 1 for b in self.batch_size_list(cfg)):
            raise ValueError(
                f"tune.batch_sizes={self.batch_size_list(cfg)!r}: decoder={cfg.decoder!r} supports batch size 1 only"
            )

    def draft_kinds(self, cfg: Config) -> list[str]:
        """Draft kinds the studies search: `drafts`, or the job's draft.kind."""
        return list(self.drafts) if self.drafts is not None else [cfg.draft.kind]

    def batch_size_list(self, cfg: Config) -> list[int]:
        """Batch sizes (one study each): `batch_sizes`, or the job's batch_size."""
        return list(self.batch_sizes) if self.batch_sizes is not None else [cfg.batch_size]

"""Typed configs, registered with Hydra's ConfigStore and validated before any model loads.

Each `__post_init__` names the field, the bad value and what is allowed. Hydra
composes YAML from `conf/` onto these schemas; `OmegaConf.to_object` builds the
dataclasses, which is where validation runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from specbench.models.draft_kinds import DRAFT_KINDS
from specbench.tune import TuneConfig

DECODERS = ("specbench", "hf_assisted")
WORKLOAD_KINDS = ("builtin", "spec_bench", "jsonl", "synthetic")
DTYPES = ("auto", "bfloat16", "float16", "float32", "float64")  # the one list; models.loading maps them


def _choice(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: must be one of {list(allowed)}")


def _at_least(name: str, value: Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}={value!r}: must be an integer >= {low}")


@dataclass
class ModelConfig:
    """One model: 'embedded', a .gguf path, a local dir or a hub id; or a shape-only preset."""

    source: Optional[str] = "embedded"
    gguf_file: Optional[str] = None
    shape: Optional[str] = None  # shape-only: random weights from a preset/config.json (timings only)


@dataclass
class PairConfig:
    """The target and, for draft.kind=model, the draft model; both on one device and dtype."""

    name: str = "embedded"
    target: ModelConfig = field(default_factory=ModelConfig)
    draft: ModelConfig = field(default_factory=lambda: ModelConfig(source=None))
    dtype: str = "auto"
    device: str = "cpu"
    cache_dir: Optional[str] = None

    def __post_init__(self) -> None:
        _choice("pair.dtype", self.dtype, DTYPES)
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"pair.device={self.device!r}: must be 'cpu', 'cuda' or 'cuda:N'")
        if not (self.target.source or self.target.shape):
            raise ValueError("pair.target: set source (model) or shape (shape-only preset)")


@dataclass
class DraftConfig:
    """How tokens are proposed: a separate model (pair.draft), a W8A16 copy of the target, or n-grams."""

    kind: str = "w8a16"
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        DRAFT_KINDS.get(self.kind, "draft.kind")
        _at_least("draft.min_ngram", self.min_ngram, 1)
        _at_least("draft.max_ngram", self.max_ngram, self.min_ngram)


@dataclass
class SamplingSpec:
    """Temperature 0 = greedy; top_k 0 and top_p 1.0 disable those filters."""

    name: str = "greedy"
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        self.build()  # SamplingConfig validates

    def build(self):
        from specbench.decoding.sampling import SamplingConfig

        return SamplingConfig(float(self.temperature), self.top_k, float(self.top_p))


@dataclass
class WorkloadConfig:
    """Prompts: the built-in set, a Spec-Bench JSONL, a user's JSONL, or synthetic token ids."""

    name: str = "builtin"
    kind: str = "builtin"
    path: Optional[str] = None
    categories: Optional[list[str]] = None
    limit_per_category: Optional[int] = None
    seed: Optional[int] = None
    prompt_tokens: int = 128  # synthetic only
    n_prompts: int = 8  # synthetic only

    def __post_init__(self) -> None:
        _choice("workload.kind", self.kind, WORKLOAD_KINDS)
        if self.kind in ("spec_bench", "jsonl") and not self.path:
            raise ValueError(f"workload.path=None: workload.kind={self.kind!r} needs a path to a JSONL file")
        if self.limit_per_category is not None:
            _at_least("workload.limit_per_category", self.limit_per_category, 1)
        _at_least("workload.prompt_tokens", self.prompt_tokens, 1)
        _at_least("workload.n_prompts", self.n_prompts, 1)


@dataclass
class Config:
    """One job: a pair, a draft, a workload, a sampling config and the decoding settings."""

    pair: PairConfig = field(default_factory=PairConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    decoder: str = "specbench"
    gamma: int = 4
    batch_size: int = 1
    max_new_tokens: int = 128
    repeats: int = 1
    warmup: int = 1  # prompts decoded (both decoders) before measuring; not recorded
    seed: int = 0
    baseline: bool = True  # interleave the autoregressive baseline prompt by prompt
    sweep_name: str = "single"
    runs_dir: str = "runs"
    force: bool = False  # re-run jobs whose results exist
    report: bool = True  # write the sweep report at the end of a multirun
    threads: Optional[int] = None  # torch CPU threads per job (None: torch's default); cores / n_jobs when parallel
    ct_bench: bool = True  # time target forwards over k = 1..16 new tokens (C_t(k)) once per job
    tune: TuneConfig = field(default_factory=TuneConfig)  # +tune=gamma: choose γ with Optuna (specbench.tune)

    def __post_init__(self) -> None:
        _choice("decoder", self.decoder, DECODERS)
        _at_least("gamma", self.gamma, 1)
        _at_least("batch_size", self.batch_size, 1)
        _at_least("max_new_tokens", self.max_new_tokens, 1)
        _at_least("repeats", self.repeats, 1)
        _at_least("warmup", self.warmup, 0)
        if self.threads is not None:
            _at_least("threads", self.threads, 1)
        if self.decoder == "hf_assisted" and self.batch_size != 1:
            raise ValueError(f"batch_size={self.batch_size}: decoder='hf_assisted' supports batch_size=1 only")
        kind = DRAFT_KINDS.get(self.draft.kind, "draft.kind")
        if kind.uses_pair_draft and not (self.pair.draft.source or self.pair.draft.shape):
            others = [k for k in DRAFT_KINDS.names() if not DRAFT_KINDS.get(k).uses_pair_draft]
            raise ValueError(
                f"draft.kind={self.draft.kind!r} needs pair.draft.source (or pair.draft.shape); pair {self.pair.name!r} "
                f"has none. Pick draft={' or draft='.join(others)}, or a pair with a draft model"
            )
        if self.decoder == "hf_assisted" and not kind.has_model:
            with_model = [k for k in DRAFT_KINDS.names() if DRAFT_KINDS.get(k).has_model]
            raise ValueError(f"draft.kind={self.draft.kind!r} with decoder='hf_assisted': transformers' assisted "
                             f"generation needs a draft model; use draft={' or draft='.join(with_model)}")
        self.tune.check(self)


def register_configs() -> None:
    """Register the schema so conf/ YAML is type-checked against it."""
    # Group YAML merges into the typed nodes of `Config`, so one schema types them all.
    ConfigStore.instance().store(name="config_schema", node=Config)

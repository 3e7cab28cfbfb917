"""Typed configs, registered with Hydra's ConfigStore and validated before any model loads.

Each `__post_init__` names the field, the bad value and what is allowed. Hydra
composes YAML from `conf/` onto these schemas; `OmegaConf.to_object` builds the
dataclasses, which is where validation runs.

Modules: `checks` (the shared field checks), `components` (models and pair, draft, sampling,
workload, forward path), `llama_cpp` (decoder=llama_cpp's engine), `tune` (`+tune=gamma`); the
job's `Config` and `register_configs` are here, and every schema is importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hydra.core.config_store import ConfigStore

from specbench.config.checks import at_least, check_sweep_name, choice
from specbench.config.components import (
    COMPILE_MODES,
    CPU_LINEARS,
    DTYPES,
    FORWARD_PATHS,
    WORKLOAD_KINDS,
    DraftConfig,
    ForwardConfig,
    ModelConfig,
    PairConfig,
    SamplingSpec,
    WorkloadConfig,
)
from specbench.config.llama_cpp import LlamaCppConfig
from specbench.config.tune import TuneConfig
from specbench.decoding.records import SPECULATIVE
from specbench.engines import ENGINES, speculative_names
from specbench.models.draft_kinds import AUTO, DRAFT_KINDS, resolve_kind

__all__ = [
    "COMPILE_MODES",
    "CPU_LINEARS",
    "DTYPES",
    "FORWARD_PATHS",
    "WORKLOAD_KINDS",
    "Config",
    "DraftConfig",
    "ForwardConfig",
    "LlamaCppConfig",
    "ModelConfig",
    "PairConfig",
    "SamplingSpec",
    "TuneConfig",
    "WorkloadConfig",
    "register_configs",
]


@dataclass
class Config:
    """One job: a pair, a draft, a workload, a sampling config and the decoding settings."""

    pair: PairConfig = field(default_factory=PairConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    decoder: str = SPECULATIVE  # a speculative engine (specbench.engines): speculative | hf_assisted | llama_cpp
    # More engines interleaved in the same job (same prompts, seeds, alternating order): a fair comparison
    # between engines, free of the drift between jobs. E.g. [hf_assisted]; plain engines too (hf_generate).
    extra_decoders: list[str] = field(default_factory=list)
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
    ct_bench: bool = True  # once per job: the C_t(k) micro-benchmark (k = 1..16) and the weight-streaming floor
    tune: TuneConfig = field(default_factory=TuneConfig)  # +tune=gamma: choose γ with Optuna (specbench.tune)
    llama_cpp: LlamaCppConfig = field(default_factory=LlamaCppConfig)  # decoder=llama_cpp's engine settings
    forward: ForwardConfig = field(default_factory=ForwardConfig)  # eager reference or the static/compiled fast path

    def __post_init__(self) -> None:
        choice("decoder", self.decoder, speculative_names())
        for name in self.extra_decoders:
            choice("extra_decoders[]", name, ENGINES.names())
        if len(set(self.all_decoders)) != len(self.all_decoders):
            raise ValueError(f"extra_decoders={list(self.extra_decoders)}: repeats decoder={self.decoder!r} or itself")
        if self.draft.kind == AUTO:
            self.draft.kind = resolve_kind(
                AUTO, self.pair.device, needs_model=self.needs_draft_model, dtype=self.pair.dtype
            )
            self.draft.__post_init__()
        at_least("gamma", self.gamma, 0)  # 0: speculation off (the plain decoder alone, through the same protocol)
        at_least("batch_size", self.batch_size, 1)
        at_least("max_new_tokens", self.max_new_tokens, 1)
        at_least("repeats", self.repeats, 1)
        at_least("warmup", self.warmup, 0)
        check_sweep_name(self.sweep_name)
        if self.threads is not None:
            at_least("threads", self.threads, 1)
        if self.workload.kind == "synthetic" and self.workload.n_prompts < self.batch_size:
            raise ValueError(
                f"batch_size={self.batch_size}: more than the workload's workload.n_prompts="
                f"{self.workload.n_prompts} prompts, so no batch of that size would run; lower batch_size or raise "
                "workload.n_prompts"
            )
        kind = DRAFT_KINDS.get(self.draft.kind, "draft.kind")
        if kind.uses_pair_draft and not (self.pair.draft.source or self.pair.draft.shape):
            others = [k for k in DRAFT_KINDS.names() if not DRAFT_KINDS.get(k).uses_pair_draft]
            raise ValueError(
                f"draft.kind={self.draft.kind!r} needs pair.draft.source (or pair.draft.shape); pair {self.pair.name!r} "
                f"has none. Pick draft={' or draft='.join(others)}, or a pair with a draft model"
            )
        self._check_engines(kind.has_model)
        self.tune.check(self)

    def _check_engines(self, draft_has_model: bool) -> None:
        """Each engine's limits (`specbench.engines.Engine`), named with the engine."""
        for name in self.all_decoders:
            engine = ENGINES.get(name)
            if engine.batch_one and self.batch_size != 1:
                raise ValueError(f"batch_size={self.batch_size}: decoder={name!r} supports batch_size=1 only")
            if engine.needs_draft_model and not draft_has_model:
                with_model = [k for k in DRAFT_KINDS.names() if DRAFT_KINDS.get(k).has_model]
                raise ValueError(
                    f"draft.kind={self.draft.kind!r} with decoder={name!r}: it needs a draft model; "
                    f"use draft={' or draft='.join(with_model)}"
                )
            if self.tune.enabled and not engine.tunable:
                raise ValueError(
                    f"tune.enabled=true with decoder={name!r}: the tuner measures specbench's engines only"
                )
            engine.check(self)

    @property
    def needs_draft_model(self) -> bool:
        """Whether an engine of the job refuses model-free drafts (draft=auto then picks a model draft)."""
        return any(ENGINES.get(n).needs_draft_model for n in self.all_decoders if n in ENGINES)

    @property
    def all_decoders(self) -> list[str]:
        """The speculative decoders this job measures (the baseline comes on top): decoder + extra_decoders."""
        return [self.decoder, *self.extra_decoders]


def register_configs() -> None:
    """Register the schema so conf/ YAML is type-checked against it."""
    # Group YAML merges into the typed nodes of `Config`, so one schema types them all.
    ConfigStore.instance().store(name="config_schema", node=Config)

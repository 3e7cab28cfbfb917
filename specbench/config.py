"""Typed configs, registered with Hydra's ConfigStore and validated before any model loads.

Each `__post_init__` names the field, the bad value and what is allowed. Hydra
composes YAML from `conf/` onto these schemas; `OmegaConf.to_object` builds the
dataclasses, which is where validation runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from specbench.decoding.records import HF_ASSISTED, LLAMA_CPP, SPECULATIVE, SPECULATIVE_DECODERS
from specbench.llama_cpp.options import DRAFT_SAMPLING, GGUF_TYPES, NGRAM_TYPES
from specbench.llama_cpp.options import check_sampling as check_llama_cpp_sampling
from specbench.models.draft_kinds import DRAFT_KINDS
from specbench.tune.objectives import OBJECTIVES
from specbench.tune.samplers import SAMPLERS

WORKLOAD_KINDS = ("builtin", "spec_bench", "jsonl", "synthetic")
DTYPES = ("auto", "bfloat16", "float16", "float32", "float64")  # the one list; models.loading maps them
FORWARD_PATHS = ("eager", "static", "compiled")  # specbench.decoding.forward builds them
CPU_LINEARS = ("tuned", "torch")  # bf16 linears on CPU: specbench.models.kernels.CpuLinear, or nn.Linear as it is
COMPILE_MODES = ("default", "max-autotune")


def _choice(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: must be one of {list(allowed)}")


def _at_least(name: str, value: Any, low: int, nullable: bool = False) -> None:
    if nullable and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}={value!r}: must be {'null or ' if nullable else ''}an integer >= {low}")


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
    cpu_linear: str = "tuned"  # bf16 on CPU: the measured-fastest kernel per shape and rows; "torch": nn.Linear

    def __post_init__(self) -> None:
        _choice("pair.dtype", self.dtype, DTYPES)
        _choice("pair.cpu_linear", self.cpu_linear, CPU_LINEARS)
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
    vocab_top: int = 0  # > 0: the draft's head scores only this many most frequent ids (FR-Spec); 0: all
    vocab_corpus: str | None = None  # text or JSONL the frequencies are counted over (None: id order)

    def __post_init__(self) -> None:
        kind = DRAFT_KINDS.get(self.kind, "draft.kind")
        _at_least("draft.min_ngram", self.min_ngram, 1)
        _at_least("draft.max_ngram", self.max_ngram, self.min_ngram)
        _at_least("draft.vocab_top", self.vocab_top, 0)
        if self.vocab_top and not kind.has_model:
            raise ValueError(
                f"draft.vocab_top={self.vocab_top}: draft.kind={self.kind!r} has no head to restrict; "
                "use 0, or a draft kind with a model"
            )
        if self.vocab_corpus is not None and not self.vocab_top:
            raise ValueError(f"draft.vocab_corpus={self.vocab_corpus!r} is only read with draft.vocab_top > 0")


@dataclass
class SamplingSpec:
    """Temperature 0 = greedy; top_k 0, top_p 1.0 and min_p 0 disable those filters; penalties and
    bans as in `specbench.decoding.sampling.SamplingConfig` (1.0 / 0.0 / empty = off)."""

    name: str = "greedy"
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    banned_token_ids: list[int] = field(default_factory=list)
    banned_sequences: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.build()  # SamplingConfig validates

    def build(self):
        from specbench.decoding.sampling import SamplingConfig

        return SamplingConfig(
            float(self.temperature),
            self.top_k,
            float(self.top_p),
            float(self.min_p),
            float(self.repetition_penalty),
            float(self.frequency_penalty),
            float(self.presence_penalty),
            tuple(self.banned_token_ids),
            tuple(tuple(s) for s in self.banned_sequences),
        )


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
    context_tokens: Optional[int] = None  # text kinds: lengthen prompts with real passages (workloads.pad_to_tokens)

    def __post_init__(self) -> None:
        _choice("workload.kind", self.kind, WORKLOAD_KINDS)
        if self.kind in ("spec_bench", "jsonl") and not self.path:
            raise ValueError(f"workload.path=None: workload.kind={self.kind!r} needs a path to a JSONL file")
        if self.limit_per_category is not None:
            _at_least("workload.limit_per_category", self.limit_per_category, 1)
        _at_least("workload.prompt_tokens", self.prompt_tokens, 1)
        _at_least("workload.n_prompts", self.n_prompts, 1)
        if self.context_tokens is not None:
            _at_least("workload.context_tokens", self.context_tokens, 1)
            if self.kind == "synthetic":
                raise ValueError(
                    f"workload.context_tokens={self.context_tokens}: synthetic prompts are already "
                    "token ids; set workload.prompt_tokens instead"
                )


@dataclass
class ForwardConfig:
    """How target and draft forwards run (`specbench.decoding.forward`): `eager` over the masked
    dynamic cache (the reference), or the fast path, a preallocated per-row cache, run eagerly
    (`static`) or through `torch.compile` (`compiled`, compiled once per process before timing)."""

    path: str = "eager"
    compile_mode: str = "max-autotune"  # compiled: inductor "default" (freezing) or "max-autotune" (GEMM templates)
    capacity: Optional[int] = None  # fast path KV columns per row; None: longest prompt + max_new_tokens + gamma + 2

    def __post_init__(self) -> None:
        _choice("forward.path", self.path, FORWARD_PATHS)
        _choice("forward.compile_mode", self.compile_mode, COMPILE_MODES)
        _at_least("forward.capacity", self.capacity, 2, nullable=True)

    @property
    def label(self) -> str:
        """The forward path's part of the rows' `forward` key: the path, with the compile mode when compiled."""
        return f"{self.path}:{self.compile_mode}" if self.path == "compiled" else self.path

    def row_label(self, cpu_linear: str) -> str:
        """The rows' `forward` key: `label`, plus `+torch_linear` when bf16 CPU linears run torch's
        nn.Linear (pair.cpu_linear=torch) rather than the tuned kernels, so profiles never mix the two."""
        return self.label if cpu_linear == "tuned" else f"{self.label}+{cpu_linear}_linear"


@dataclass
class LlamaCppConfig:
    """decoder=llama_cpp: llama.cpp's llama-server, with and without a draft (`specbench.llama_cpp`).

    target/draft are GGUF types of the embedded model (the shipped Q4_1, or a copy made once with
    llama-quantize); draft may instead be an n-gram lookup type. γ is --spec-draft-n-max.
    """

    target: str = "F16"
    draft: str = "Q4_1"
    draft_min: int = 0  # --spec-draft-n-min: pinned so every round drafts up to γ
    draft_p_min: float = 0.0  # --spec-draft-p-min: 0 = never stop a draft early on low confidence
    draft_sampling: str = "greedy"  # llama.cpp's default: argmax draft, accept while it matches the target's sample
    threads: Optional[int] = None  # None: the job's `threads`, else every core this process may use
    ctx_size: int = 4096
    port: int = 0  # 0: a free port per server
    startup_timeout: float = 120.0
    bin_dir: Optional[str] = None  # None: $SPECBENCH_LLAMA_CPP_BIN, the build cache, then PATH

    def __post_init__(self) -> None:
        _choice("llama_cpp.target", self.target, GGUF_TYPES)
        _choice("llama_cpp.draft", self.draft, GGUF_TYPES + NGRAM_TYPES)
        _choice("llama_cpp.draft_sampling", self.draft_sampling, DRAFT_SAMPLING)
        _at_least("llama_cpp.draft_min", self.draft_min, 0)
        _at_least("llama_cpp.threads", self.threads, 1, nullable=True)
        _at_least("llama_cpp.ctx_size", self.ctx_size, 64)
        if not 0.0 <= float(self.draft_p_min) <= 1.0:
            raise ValueError(f"llama_cpp.draft_p_min={self.draft_p_min!r}: must be in [0, 1]")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"llama_cpp.port={self.port!r}: must be 0 (a free port) or a port number 1..65535")
        if not float(self.startup_timeout) > 0:
            raise ValueError(f"llama_cpp.startup_timeout={self.startup_timeout!r}: must be > 0 seconds")

    @property
    def draft_is_ngram(self) -> bool:
        return self.draft in NGRAM_TYPES

    @property
    def row_dtype(self) -> str:
        """The `dtype` key of llama.cpp's rows: the target's GGUF type."""
        return f"gguf:{self.target}"

    @property
    def row_draft(self) -> str:
        """The `draft` key of llama.cpp's speculative rows: the draft's GGUF type, or the n-gram type."""
        return self.draft if self.draft_is_ngram else f"gguf:{self.draft}"


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
            _at_least(f"tune.{name}", getattr(self, name), 1)
        _at_least("tune.prune_after", self.prune_after, 2)
        for name in ("max_prompts", "profile_max_new_tokens"):
            _at_least(f"tune.{name}", getattr(self, name), 1, nullable=True)
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
        if cfg.decoder == HF_ASSISTED and any(b != 1 for b in self.batch_size_list(cfg)):
            raise ValueError(
                f"tune.batch_sizes={self.batch_size_list(cfg)!r}: decoder='hf_assisted' supports batch size 1 only"
            )

    def draft_kinds(self, cfg: Config) -> list[str]:
        """Draft kinds the studies search: `drafts`, or the job's draft.kind."""
        return list(self.drafts) if self.drafts is not None else [cfg.draft.kind]

    def batch_size_list(self, cfg: Config) -> list[int]:
        """Batch sizes (one study each): `batch_sizes`, or the job's batch_size."""
        return list(self.batch_sizes) if self.batch_sizes is not None else [cfg.batch_size]


@dataclass
class Config:
    """One job: a pair, a draft, a workload, a sampling config and the decoding settings."""

    pair: PairConfig = field(default_factory=PairConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    decoder: str = SPECULATIVE  # speculative (specbench's) | hf_assisted (transformers') | llama_cpp
    # More decoders interleaved in the same job (same prompts, seeds, alternating order): a fair
    # comparison between decoders, free of the drift between jobs. E.g. [hf_assisted].
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
        _choice("decoder", self.decoder, SPECULATIVE_DECODERS)
        for name in self.extra_decoders:
            _choice("extra_decoders[]", name, SPECULATIVE_DECODERS)
        if len(set(self.all_decoders)) != len(self.all_decoders):
            raise ValueError(f"extra_decoders={list(self.extra_decoders)}: repeats decoder={self.decoder!r} or itself")
        _at_least("gamma", self.gamma, 0)  # 0: speculation off (the plain decoder alone, through the same protocol)
        _at_least("batch_size", self.batch_size, 1)
        _at_least("max_new_tokens", self.max_new_tokens, 1)
        _at_least("repeats", self.repeats, 1)
        _at_least("warmup", self.warmup, 0)
        if self.threads is not None:
            _at_least("threads", self.threads, 1)
        if HF_ASSISTED in self.all_decoders and self.batch_size != 1:
            raise ValueError(f"batch_size={self.batch_size}: decoder='hf_assisted' supports batch_size=1 only")
        kind = DRAFT_KINDS.get(self.draft.kind, "draft.kind")
        if kind.uses_pair_draft and not (self.pair.draft.source or self.pair.draft.shape):
            others = [k for k in DRAFT_KINDS.names() if not DRAFT_KINDS.get(k).uses_pair_draft]
            raise ValueError(
                f"draft.kind={self.draft.kind!r} needs pair.draft.source (or pair.draft.shape); pair {self.pair.name!r} "
                f"has none. Pick draft={' or draft='.join(others)}, or a pair with a draft model"
            )
        if HF_ASSISTED in self.all_decoders and not kind.has_model:
            with_model = [k for k in DRAFT_KINDS.names() if DRAFT_KINDS.get(k).has_model]
            raise ValueError(
                f"draft.kind={self.draft.kind!r} with decoder='hf_assisted': transformers' assisted "
                f"generation needs a draft model; use draft={' or draft='.join(with_model)}"
            )
        if HF_ASSISTED in self.all_decoders:
            from specbench.decoding.hf_assisted import check_sampling

            check_sampling(self.sampling.build(), set())  # settings transformers cannot apply
        if LLAMA_CPP in self.all_decoders:
            self._check_llama_cpp()
        self.tune.check(self)

    def _check_llama_cpp(self) -> None:
        if self.batch_size != 1:
            raise ValueError(f"batch_size={self.batch_size}: decoder='llama_cpp' supports batch_size=1 only")
        if self.pair.target.source != "embedded" or self.pair.target.shape:
            raise ValueError(
                f"pair.target.source={self.pair.target.source!r}: decoder='llama_cpp' runs GGUF copies of the "
                "embedded model; use pair=embedded"
            )
        if self.tune.enabled:
            raise ValueError("tune.enabled=true with decoder='llama_cpp': the tuner measures specbench's decoders only")
        check_llama_cpp_sampling(self.sampling.build())

    @property
    def all_decoders(self) -> list[str]:
        """The speculative decoders this job measures (the baseline comes on top): decoder + extra_decoders."""
        return [self.decoder, *self.extra_decoders]


def register_configs() -> None:
    """Register the schema so conf/ YAML is type-checked against it."""
    # Group YAML merges into the typed nodes of `Config`, so one schema types them all.
    ConfigStore.instance().store(name="config_schema", node=Config)

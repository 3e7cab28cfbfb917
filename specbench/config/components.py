"""The parts of a job's config: models and pair, draft, sampling, workload and forward path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from specbench.config.checks import at_least, choice
from specbench.decoding.policies import POLICIES
from specbench.models.draft_kinds import AUTO, DRAFT_KINDS, INT4_GROUPS

WORKLOAD_KINDS = ("builtin", "spec_bench", "jsonl", "synthetic")
DTYPES = ("auto", "bfloat16", "float16", "float32", "float64")  # the one list; models.loading maps them
FORWARD_PATHS = (
    "auto",
    "eager",
    "static",
    "compiled",
)  # auto: specbench.decoding.forward_choice picks one of the others
CPU_LINEARS = ("tuned", "torch")  # bf16 linears on CPU: specbench.models.kernels.CpuLinear, or nn.Linear as it is
COMPILE_MODES = ("default", "max-autotune", "reduce-overhead")  # reduce-overhead: CUDA graphs (plain compile on CPU)


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
        choice("pair.dtype", self.dtype, DTYPES)
        choice("pair.cpu_linear", self.cpu_linear, CPU_LINEARS)
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"pair.device={self.device!r}: must be 'cpu', 'cuda' or 'cuda:N'")
        if not (self.target.source or self.target.shape):
            raise ValueError("pair.target: set source (model) or shape (shape-only preset)")
        for role, model in (("target", self.target), ("draft", self.draft)):
            if model.shape and (model.source or model.gguf_file):
                given = f"source={model.source!r}" if model.source else f"gguf_file={model.gguf_file!r}"
                raise ValueError(
                    f"pair.{role}.{given} with pair.{role}.shape={model.shape!r}: a shape-only model has random "
                    f"weights and would ignore the {given.split('=')[0]}; set one of them (pair.{role}.shape=null "
                    "to load the model)"
                )


@dataclass
class DraftConfig:
    """How tokens are proposed: a separate model (pair.draft), a W8A16 or W4A16 copy of the target, or n-grams."""

    kind: str = AUTO  # a DRAFT_KINDS name, or auto: the measured default per device (DEFAULT_DRAFTS)
    max_ngram: int = 3
    min_ngram: int = 1
    vocab_top: int = 0  # > 0: the draft's head scores only this many most frequent ids (FR-Spec); 0: all
    vocab_corpus: str | None = None  # text or JSONL the frequencies are counted over (None: id order)
    # A weight-only copy of the target (w8a16, w4a16, w4a16h8) starts from the target's KV of the prompt
    # rather than its own prefill; other kinds always prefill themselves.
    target_prompt_kv: bool = True
    # With it, on the fast path (forward.path static / compiled), the copy also takes the K/V the target's verify
    # wrote each round: every committed token's K/V is the target's, and no catch-up forward follows an
    # all-accepted round.
    target_decode_kv: bool = True
    # How many of up to `gamma` tokens a round drafts (specbench.decoding.policies: fixed, confidence_stop,
    # schedule, prune_renormalized; analysis/draft_policies/)
    policy: str = "fixed"
    # The policy's threshold on the draft's probability q(x_i) (confidence_stop, prune_renormalized; others ignore it)
    tau: float = 0.0
    # n-gram lookup without a match (or past its end): draft the last token again (True), or propose nothing,
    # so the round is a plain target step (False)
    ngram_fill: bool = True
    # int4 copies (w4a16, w4a16h8): input channels per (scale, zero). 128 as GPTQ/AWQ checkpoints; 32 is the
    # embedded target's own Q4_1 grid, where the copy reproduces the target's weights (docs/decoder.md)
    group_size: int = 128

    def __post_init__(self) -> None:
        lossless = tuple(name for name in POLICIES if POLICIES.get(name).lossless)
        if POLICIES.get(self.policy, "draft.policy") and self.policy not in lossless:
            raise ValueError(
                f"draft.policy={self.policy!r}: not lossless, for the audit only "
                f"(python -m specbench.audit --decoder policy:{self.policy}); must be one of {list(lossless)}"
            )
        if not 0.0 <= self.tau <= 1.0:
            raise ValueError(f"draft.tau={self.tau!r}: must be a probability in [0, 1]")
        at_least("draft.min_ngram", self.min_ngram, 1)
        at_least("draft.max_ngram", self.max_ngram, self.min_ngram)
        at_least("draft.vocab_top", self.vocab_top, 0)
        choice("draft.group_size", self.group_size, INT4_GROUPS)
        if self.kind == AUTO:  # resolved per device by Config (or load_pair); checked again then
            return
        kind = DRAFT_KINDS.get(self.kind, "draft.kind")
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
        choice("workload.kind", self.kind, WORKLOAD_KINDS)
        if self.kind in ("spec_bench", "jsonl") and not self.path:
            raise ValueError(f"workload.path=None: workload.kind={self.kind!r} needs a path to a JSONL file")
        if self.limit_per_category is not None:
            at_least("workload.limit_per_category", self.limit_per_category, 1)
        at_least("workload.prompt_tokens", self.prompt_tokens, 1)
        at_least("workload.n_prompts", self.n_prompts, 1)
        if self.context_tokens is not None:
            at_least("workload.context_tokens", self.context_tokens, 1)
            if self.kind == "synthetic":
                raise ValueError(
                    f"workload.context_tokens={self.context_tokens}: synthetic prompts are already "
                    "token ids; set workload.prompt_tokens instead"
                )


@dataclass
class ForwardConfig:
    """How target and draft forwards run (`specbench.decoding.forward`): `auto` (the
    compiled fast path where it runs, else eager with the reason in done.json; `forward_choice`; the default),
    `eager` over the masked dynamic cache (the reference and the tests' oracle), or the fast path, a preallocated per-row cache, run
    eagerly (`static`) or through `torch.compile` (`compiled`, compiled once per process before timing)."""

    path: str = "auto"
    compile_mode: str = "max-autotune"  # compiled: inductor "default" (freezing), "max-autotune" (GEMM templates) or "reduce-overhead" (CUDA graphs; auto picks it on cuda)
    capacity: Optional[int] = None  # fast path KV columns per row; None: longest prompt + max_new_tokens + gamma + 2

    def __post_init__(self) -> None:
        choice("forward.path", self.path, FORWARD_PATHS)
        choice("forward.compile_mode", self.compile_mode, COMPILE_MODES)
        at_least("forward.capacity", self.capacity, 2, nullable=True)

    @property
    def label(self) -> str:
        """The forward path's part of the rows' `forward` key: the path, with the compile mode when compiled."""
        return f"{self.path}:{self.compile_mode}" if self.path == "compiled" else self.path

    def row_label(self, cpu_linear: str) -> str:
        """The rows' `forward` key: `label`, plus `+torch_linear` when bf16 CPU linears run torch's
        nn.Linear (pair.cpu_linear=torch) rather than the tuned kernels, so profiles never mix the two."""
        return self.label if cpu_linear == "tuned" else f"{self.label}+{cpu_linear}_linear"

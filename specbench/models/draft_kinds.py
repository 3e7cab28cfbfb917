"""The draft kinds a job can name (`draft=<kind>`): one registration each.

A kind says how its draft model is obtained for a target (or that it needs none), how
rows label it, and how a fresh `Draft` is built for a batch. Config validation, the
pair loader, job labels, the tuner's search space and the API all read `DRAFT_KINDS`,
so a new kind is one `DRAFT_KINDS.register(...)` plus a `conf/draft/<kind>.yaml`.
Import-light: the heavy modules load inside the functions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specbench.models.int4_groups import DEFAULT_INT4_GROUP, INT4_GROUPS  # noqa: F401 - re-exported for config
from specbench.registry import Registry

if TYPE_CHECKING:
    from specbench.config import DraftConfig, PairConfig
    from specbench.decoding.drafts import Draft
    from specbench.models.pair import Pair


@dataclass(frozen=True)
class DraftKind:
    """How one kind of draft is loaded, labelled and built.

    `load(target, pair_cfg, draft_cfg, load_model, vocab)` returns (draft model or None, its own
    tokenizer or None); `load_model(model_cfg, field)` loads a configured model that way; `vocab`
    (None: all) is the ids the draft's head scores (`draft.vocab_top`, `specbench.models.vocab`).
    `label(target_label, pair_cfg, draft_cfg)` names the draft in rows.
    `build(pair)` returns a fresh `Draft` for one batch.
    """

    load: Callable[..., Any]
    label: Callable[[str, PairConfig, DraftConfig], str]
    build: Callable[[Pair], Draft]
    uses_pair_draft: bool = False  # needs pair.draft (a separate model)
    has_model: bool = True  # a draft model exists (transformers' assisted generation can drive it)
    weights: str | None = None  # a weight-only copy of the target: its format ('int8' | 'int4'; dtype=auto times it)
    head: str | None = None  # the output head's format where it differs from `weights`

    @property
    def formats(self) -> tuple[str, ...]:
        """Every weight-only format the draft's layers use (each needs a kernel on the job's device)."""
        return tuple(dict.fromkeys(f for f in (self.weights, self.head) if f))

    def row_label(self, target: str, pair_cfg: PairConfig, draft_cfg: DraftConfig) -> str:
        """The draft's name in rows: `label`, plus the head's vocabulary size when it is restricted."""
        top = draft_cfg.vocab_top
        return self.label(target, pair_cfg, draft_cfg) + (f"+top{top}" if top else "")


DRAFT_KINDS: Registry[DraftKind] = Registry("draft.kind")

AUTO = "auto"  # draft.kind=auto (the default): the first of DEFAULT_DRAFTS' kinds the job can use
# The embedded pair's drafts per device class, best first, from end-to-end runs on that class (2 threads, Spec-Bench
# prompts, greedy; `+sweep=engines` since it replaced scripts/bench_fast_path.py). A kind moves up only when a run
# separates it. The evidence folder of each class is beside it; docs/fast-path.md has the table.
# "cuda": a kind whose formats have no CUDA kernel in this torch is skipped (`device_refusal`); int4 first, as it
# streams a quarter of the bf16 bytes (analysis/gpu_h200/).
# The CPU rows come from honest drafts: int4 in groups of 128, off the embedded target's own Q4_1 grid of 32, where a
# copy agrees ~96% as an artefact (analysis/draft_agreement_groups_cpu_avx512/).
DEFAULT_DRAFTS: dict[str, tuple[str, ...]] = {
    # AMX, +sweep=engines with group-128 int4 (gamma 4): W8A16 1.20x [1.11, 1.26] the fast baseline, w4a16h8-g128
    # 1.01x [0.91, 1.14], n-gram 0.86x [0.81, 1.17] (analysis/engines_drafts_cpu_amx/); w4a16h8 led only with
    # group-32 copies (analysis/fast_path_w4a16h8_concat_cpu_amx/)
    "amx": ("w8a16", "w4a16h8", "ngram", "w4a16"),
    # AVX-512 without AMX, from +sweep=engines with group-128 int4: W8A16 on specbench's int8 kernel is the one draft
    # that beats the fast baseline (analysis/engines_cpu_avx512/); the others did not, on torch's kernels
    # (analysis/engines_drafts_cpu_avx512/)
    "avx512": ("w8a16", "w4a16h8", "ngram", "w4a16"),
    # AVX2: on the AVX2 path with group-128 int4 (+sweep=engines, ATEN_CPU_CAPABILITY=avx2) W8A16 on specbench's int8
    # kernel 1.02x the fast baseline, w4a16h8-g128 0.68x, CIs disjoint (analysis/engines_cpu_avx2_path/); the older
    # fp32 runs with group-32 copies never separated the two (analysis/fast_path_cpu_matvec_cpu_amx_avx2_kernels/)
    "avx2": ("w8a16", "w4a16h8", "ngram", "w4a16"),
    # AVX2 with bf16 weights (pair.dtype=bfloat16): W8A16 on specbench's int8 kernel 1.07x
    # [1.04, 1.10] the bf16 fast baseline (analysis/engines_dtype_cpu_avx2_path/); n-gram lost on every class run
    "avx2_bf16": ("w8a16", "ngram"),
    "other": ("ngram", "w8a16"),  # no vector kernels to speak of: no model draft can be cheap
    "cuda": ("w4a16", "w8a16", "ngram"),
}


def resolve_kind(kind: str, device: str, needs_model: bool = False, dtype: str = "auto") -> str:
    """`kind`, or for `auto` the best default draft kind on `device` ('cpu', 'cuda', 'cuda:N') of this
    machine and the pair's `dtype` (a forced half dtype keeps AVX2 drafts off specbench's fp32 kernels):
    with `needs_model` (transformers' assisted generation drives the draft) the best with a model. A kind
    with no kernel on the device (`device_refusal`) is skipped by `auto` and refused when named."""
    if kind != AUTO:
        reason = device_refusal(kind, device, dtype)
        if reason:
            usable = [k for k in DRAFT_KINDS.names() if not device_refusal(k, device, dtype)]
            raise ValueError(f"draft.kind={kind!r} on {device}: {reason}; usable there: {usable}")
        return kind
    ranked = DEFAULT_DRAFTS[draft_class(device, dtype)]
    return next(
        k for k in ranked if (DRAFT_KINDS.get(k).has_model or not needs_model) and not device_refusal(k, device, dtype)
    )


def device_refusal(kind: str, device: str, dtype: str = "auto") -> str | None:
    """Why weight-only draft `kind` has no kernel on a CUDA `device` (its layers would dequantize every weight on
    every call, costing more than the target); None where it has one, or is not weight-only, or not on CUDA."""
    formats = DRAFT_KINDS.get(kind, "draft.kind").formats
    if not formats or not str(device).startswith("cuda"):
        return None
    import torch

    from specbench.models.quant import cuda_kernel_missing

    activations = getattr(torch, "bfloat16" if dtype == "auto" else dtype)  # auto is bf16 on every GPU it runs on
    reasons = [r for f in formats if (r := cuda_kernel_missing(f, activations))]
    return "; ".join(reasons) or None


def draft_class(device: str, dtype: str) -> str:
    """The `DEFAULT_DRAFTS` key for a job: 'cuda', this CPU's class, or 'avx2_bf16' for half weights on AVX2."""
    if str(device).startswith("cuda"):
        return "cuda"  # the CPU is not read
    from specbench.bench.envinfo import cpu_class

    cpu = cpu_class()
    return "avx2_bf16" if cpu == "avx2" and dtype in ("bfloat16", "float16") else cpu


def takes_prompt_kv(pair: Pair) -> bool:
    """Whether the pair's draft starts from the target's KV of the prompt: a weight-only copy, unless told not to."""
    return DRAFT_KINDS.get(pair.draft_kind).weights is not None and pair.draft_cfg.target_prompt_kv


def takes_decode_kv(pair: Pair) -> bool:
    """Whether it also takes the target's K/V of each round on the pair's path (the fast path only): its forwards
    are then one token a row (`forward.DECODE_KV_DRAFT_KS`)."""
    return takes_prompt_kv(pair) and pair.draft_cfg.target_decode_kv and pair.forward.fast


def _model_draft(pair: Pair) -> Draft:
    from specbench.decoding.drafts import ModelDraft

    return ModelDraft(
        pair.draft_model,
        name=pair.draft_kind,
        lm=pair.forward.lm(pair.draft_model),
        target_prompt_kv=takes_prompt_kv(pair),
        target_decode_kv=takes_decode_kv(pair),
    )


def _load_pair_draft(target, pair_cfg, draft_cfg, load_model, vocab):
    from specbench.models.vocab import restricted_copy

    model, tokenizer = load_model(pair_cfg.draft, "pair.draft")
    return (model if vocab is None else restricted_copy(model, vocab)), tokenizer


def _load_w8a16(target, pair_cfg, draft_cfg, load_model, vocab):
    from specbench.models.quant import quantize_w8a16_cached

    return quantize_w8a16_cached(target, vocab), None


def _load_w4a16(target, pair_cfg, draft_cfg, load_model, vocab, head: str = "int4"):
    from specbench.models.quant import quantize_w4a16_cached

    return quantize_w4a16_cached(target, vocab, head, draft_cfg.group_size), None


def _ngram(pair: Pair) -> Draft:
    from specbench.decoding.drafts import NgramDraft

    d = pair.draft_cfg
    return NgramDraft(
        pair.target.config.vocab_size, d.max_ngram, d.min_ngram, device=pair.target.device, fill=d.ngram_fill
    )


DRAFT_KINDS.register(
    "model",
    DraftKind(
        load=_load_pair_draft,
        label=lambda target, p, d: p.draft.shape or p.draft.source,
        build=_model_draft,
        uses_pair_draft=True,
    ),
)
DRAFT_KINDS.register(
    "w8a16",
    DraftKind(
        load=_load_w8a16,
        label=lambda target, p, d: f"w8a16({target})",
        build=_model_draft,
        weights="int8",
    ),
)
DRAFT_KINDS.register(
    "w4a16",
    DraftKind(
        load=_load_w4a16,
        label=lambda target, p, d: f"w4a16-g{d.group_size}({target})",  # rows of two group sizes never mix
        build=_model_draft,
        weights="int4",
    ),
)
DRAFT_KINDS.register(
    "w4a16h8",  # int4 body, int8 head: the head is where int4 loses agreement (`specbench.models.quant`)
    DraftKind(
        load=functools.partial(_load_w4a16, head="int8"),
        label=lambda target, p, d: f"w4a16h8-g{d.group_size}({target})",
        build=_model_draft,
        weights="int4",
        head="int8",
    ),
)
DRAFT_KINDS.register(
    "ngram",
    DraftKind(
        load=lambda *a: (None, None),  # no head: config refuses draft.vocab_top
        label=lambda target, p, d: f"ngram({d.min_ngram}-{d.max_ngram})",
        build=_ngram,
        has_model=False,
    ),
)

"""Build the target and the draft a job asks for; models are cached per process so a
sweep's jobs (and the baseline) share one loaded copy."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specbench.decoding.drafts import Draft
from specbench.decoding.forward import ForwardPath
from specbench.models.draft_kinds import AUTO, DRAFT_KINDS, resolve_kind
from specbench.models.kernels import tune_cpu_linears
from specbench.models.loading import (
    auto_dtype,
    check_same_tokenizer,
    check_same_vocab,
    eos_ids,
    load_model,
    resolve_dtype,
)
from specbench.models.vocab import frequent_tokens

if TYPE_CHECKING:  # annotations only: config reads the engines registry, whose engines load pairs
    from specbench.config import DraftConfig, ModelConfig, PairConfig


@dataclass
class Pair:
    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None  # None for shape-only models (synthetic token ids)
    draft_model: PreTrainedModel | None  # the draft's model (None for n-gram lookup)
    draft_kind: str
    eos: set[int]
    shape_only: bool
    draft_cfg: DraftConfig
    forward: ForwardPath = field(default_factory=ForwardPath)  # the job sets its path and capacity

    def new_draft(self) -> Draft:
        """A draft with fresh state, proposing for this pair's target."""
        return DRAFT_KINDS.get(self.draft_kind, "draft.kind").build(self)

    def target_lm(self):
        """The target's LM object on this pair's forward path (`CachedLM` or `StaticLM`)."""
        return self.forward.lm(self.target)

    def configs(self) -> list:
        """The model configs the forward path runs: the target's, and the draft model's when there is one."""
        return [m.config for m in (self.target, self.draft_model) if m is not None]


@functools.lru_cache(maxsize=4)
def _load(
    source: str | None, gguf_file: str | None, shape: str | None, dtype: str, device: str, cache_dir, field, linear
):
    if shape:
        from specbench.models.shapes import build_shape_only_model

        seed = 1 if field == "pair.draft" else 0  # a draft of the same shape must not be the target's twin
        model = build_shape_only_model(shape, dtype=resolve_dtype(dtype, device), device=device, seed=seed)
        tokenizer = None
    else:
        model, tokenizer = load_model(source, gguf_file, dtype, device, Path(cache_dir) if cache_dir else None, field)
    if linear == "tuned":
        tune_cpu_linears(model)  # bf16 on CPU only; a no-op elsewhere
    return model, tokenizer


def _load_config(m: ModelConfig, pair: PairConfig, field: str):
    return _load(m.source, m.gguf_file, m.shape, pair.dtype, pair.device, pair.cache_dir, field, pair.cpu_linear)


def load_pair(pair: PairConfig, draft: DraftConfig) -> Pair:
    """Load (or reuse) the models; checks that target and draft share tokenizer and vocabulary."""
    if draft.kind == AUTO:
        draft = dataclasses.replace(draft, kind=resolve_kind(AUTO, pair.device, dtype=pair.dtype))
    kind = DRAFT_KINDS.get(draft.kind, "draft.kind")
    if pair.dtype == "auto":  # resolved before loading, with the draft's kernels: one cached load per dtype
        pair = dataclasses.replace(pair, dtype=auto_dtype(pair.device, kind.weights, pair.cpu_linear))
    target, tokenizer = _load_config(pair.target, pair, "pair.target")
    eos = eos_ids(tokenizer, target)
    vocab = (
        frequent_tokens(draft.vocab_top, target.config.vocab_size, eos, tokenizer, draft.vocab_corpus)
        if draft.vocab_top
        else None
    )
    draft_model, draft_tokenizer = kind.load(target, pair, draft, lambda m, f: _load_config(m, pair, f), vocab)
    if tokenizer is not None and draft_tokenizer is not None:
        check_same_tokenizer(tokenizer, draft_tokenizer)
    if draft_model is not None:
        check_same_vocab(target, draft_model)
    shape_only = bool(getattr(target.config, "specbench_shape_only", False))
    return Pair(target, tokenizer, draft_model, draft.kind, eos, shape_only, draft)

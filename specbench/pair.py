"""Build the target and the draft a job asks for; models are cached per process so a
sweep's jobs (and the baseline) share one loaded copy."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specbench.config import DraftConfig, ModelConfig, PairConfig
from specbench.drafts import Draft, ModelDraft, NgramDraft
from specbench.models import check_same_tokenizer, check_same_vocab, eos_ids, load_model, resolve_dtype
from specbench.quant import quantize_w8a16


@dataclass
class Pair:
    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None  # None for shape-only models (synthetic token ids)
    draft_model: PreTrainedModel | None  # the draft's model (None for n-gram lookup)
    draft_kind: str
    eos: set[int]
    shape_only: bool
    max_ngram: int = 3
    min_ngram: int = 1

    def new_draft(self) -> Draft:
        """A draft with fresh state, proposing for this pair's target."""
        if self.draft_kind == "ngram":
            vocab = self.target.config.vocab_size
            return NgramDraft(vocab, self.max_ngram, self.min_ngram, device=self.target.device)
        return ModelDraft(self.draft_model, name=self.draft_kind)


@functools.lru_cache(maxsize=4)
def _load(source: str | None, gguf_file: str | None, shape: str | None, dtype: str, device: str, cache_dir, field):
    if shape:
        from specbench.shapes import build_shape_only_model

        seed = 1 if field == "pair.draft" else 0  # a draft of the same shape must not be the target's twin
        return build_shape_only_model(shape, dtype=resolve_dtype(dtype, device), device=device, seed=seed), None
    return load_model(source, gguf_file, dtype, device, Path(cache_dir) if cache_dir else None, field)


def _load_config(m: ModelConfig, pair: PairConfig, field: str):
    return _load(m.source, m.gguf_file, m.shape, pair.dtype, pair.device, pair.cache_dir, field)


@functools.lru_cache(maxsize=2)
def _w8a16(target: PreTrainedModel) -> PreTrainedModel:
    return quantize_w8a16(target)


def load_pair(pair: PairConfig, draft: DraftConfig) -> Pair:
    """Load (or reuse) the models; checks that target and draft share tokenizer and vocabulary."""
    target, tokenizer = _load_config(pair.target, pair, "pair.target")
    draft_model = None
    if draft.kind == "w8a16":
        draft_model = _w8a16(target)
    elif draft.kind == "model":
        draft_model, draft_tokenizer = _load_config(pair.draft, pair, "pair.draft")
        if tokenizer is not None and draft_tokenizer is not None:
            check_same_tokenizer(tokenizer, draft_tokenizer)
        check_same_vocab(target, draft_model)
    shape_only = bool(getattr(target.config, "specbench_shape_only", False))
    return Pair(target, tokenizer, draft_model, draft.kind, eos_ids(tokenizer, target), shape_only,
                draft.max_ngram, draft.min_ngram)  # fmt: skip

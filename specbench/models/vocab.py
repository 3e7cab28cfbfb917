"""A draft head over the most frequent tokens only (FR-Spec): `draft.vocab_top`.

The lm_head is a fifth of SmolLM2-135M's weight bytes and the largest single matvec of a step. A draft
whose head scores only the `top` most frequent token ids reads a fraction of it; every other id gets
logit −inf, so q = 0 there. The acceptance rule stays exact (a token the draft cannot propose is only
reachable through the residual (p − q)+, which is then p itself); what the subset costs is acceptance
wherever the target's token falls outside it.

Frequency: token counts over `draft.vocab_corpus` (a text file, or JSONL whose string values are text),
ties and unseen ids ranked by id. A BPE vocabulary's ids follow its merge order, which tracks frequency
in the tokenizer's training corpus, so with no corpus the subset is the first `top` ids. EOS ids are
always kept: a draft that cannot propose the end of an answer rejects there every time.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from specbench.models.kernels import CpuLinear, tune_cpu_linears


class VocabError(ValueError):
    """A draft vocabulary setting that cannot be applied (size, corpus file)."""


class SubsetHead(nn.Module):
    """Logits [..., vocab_size] from a head over `keep` ids only; −inf elsewhere (q = 0 after softmax)."""

    def __init__(self, head: nn.Linear, keep: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        rows = keep.to(head.weight.device)
        self.linear = nn.Linear(head.in_features, len(rows), bias=head.bias is not None)
        self.linear.to(dtype=head.weight.dtype, device=head.weight.device)
        with torch.no_grad():
            self.linear.weight.copy_(head.weight[rows])
            if head.bias is not None:
                self.linear.bias.copy_(head.bias[rows])
        self.linear.requires_grad_(False)
        self.register_buffer("keep", rows)  # [top]
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        scores = self.linear(hidden)  # [..., top]
        full = scores.new_full((*scores.shape[:-1], self.vocab_size), float("-inf"))  # [..., V]
        return full.index_copy(-1, self.keep, scores)


def restrict_head(model: nn.Module, keep: tuple[int, ...]) -> nn.Module:
    """`model` (changed in place and returned) with its output head restricted to the ids in `keep`; the
    new head's linear is a plain nn.Linear (a quantizer replaces it; `restricted_copy` tunes it)."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise VocabError(f"draft.vocab_top: the draft's output head is a {type(head).__name__}, not a linear layer")
    vocab_size = model.config.vocab_size
    model.set_output_embeddings(SubsetHead(head, torch.tensor(sorted(keep), dtype=torch.long), vocab_size))
    return model


@functools.lru_cache(maxsize=2)
def restricted_copy(model: nn.Module, keep: tuple[int, ...]) -> nn.Module:
    """A deep copy of `model` with its head restricted to `keep`, once per process (jobs share it); a
    head that ran the tuned CPU kernels keeps them, chosen for its new shape."""
    restricted = restrict_head(copy.deepcopy(model), keep)
    if isinstance(model.get_output_embeddings(), CpuLinear):
        tune_cpu_linears(restricted.get_output_embeddings())
    return restricted


def frequent_tokens(
    top: int, vocab_size: int, eos: set[int], tokenizer=None, corpus: str | Path | None = None
) -> tuple[int, ...]:
    """The ids a `top`-token draft head keeps (sorted): the EOS ids, then the most frequent in `corpus`
    (ties and unseen ids by id; no corpus: by id alone)."""
    if not 0 < top < vocab_size:
        raise VocabError(f"draft.vocab_top={top}: must be in [1, {vocab_size - 1}] (0 keeps the whole vocabulary)")
    if corpus is None:
        order: Iterable[int] = range(vocab_size)
    elif tokenizer is None:
        raise VocabError(f"draft.vocab_corpus={str(corpus)!r}: the target has no tokenizer to count tokens with")
    else:  # a stable sort on −count: equal counts keep id (merge) order
        order = torch.sort(-corpus_counts(tokenizer, str(corpus), vocab_size), stable=True).indices.tolist()
    keep = {i for i in eos if 0 <= i < vocab_size}
    keep.update(itertools.islice((i for i in order if i not in keep), max(0, top - len(keep))))
    return tuple(sorted(keep))


@functools.lru_cache(maxsize=4)
def corpus_counts(tokenizer, corpus: str, vocab_size: int) -> torch.Tensor:
    """Occurrences of each id [vocab_size] in the corpus, tokenized once per process (a sweep's jobs
    share it)."""
    ids = [i for text in corpus_texts(Path(corpus)) for i in tokenizer(text)["input_ids"]]
    return torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=vocab_size)[:vocab_size]


def corpus_texts(path: Path) -> list[str]:
    """The texts of a corpus file: every string value (nested lists and objects too) of a .jsonl file's
    lines, or the whole file as one text."""
    if not path.is_file():
        raise VocabError(f"draft.vocab_corpus={str(path)!r}: no such file")
    if path.suffix != ".jsonl":
        return [path.read_text(encoding="utf-8", errors="replace")]
    texts: list[str] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            texts.extend(_strings(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise VocabError(f"draft.vocab_corpus={str(path)!r}: line {lineno} is not JSON ({exc.msg})") from exc
    return texts


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []

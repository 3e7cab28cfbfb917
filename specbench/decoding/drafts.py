"""Drafts: whatever proposes gamma tokens with their processed distribution q.

The decoder never branches on the kind of draft it holds; it calls `prefill`,
`propose`, `commit` and `select_rows`. A model draft (a smaller model, or the
W8A16 copy of the target) keeps a KV cache; n-gram lookup keeps none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from transformers import PreTrainedModel

from specbench.decoding.kvcache import CachedLM, feed_suffix
from specbench.decoding.lm import LM
from specbench.decoding.sampling import SamplingConfig, TokenContext, next_tokens, process_logits, sample
from specbench.decoding.static_kv import StaticLM
from specbench.decoding.timing import count_host_sync, to_device


class Draft(Protocol):
    name: str
    # After `propose`: how many of its drafts each row really proposes (the rest fills the rectangle and is
    # not verified); None: all of them. n-gram lookup without a match proposes nothing (`fill=False`).
    proposed: list[int] | None

    def prefill(self, prompts: list[list[int]], target: LM | None = None) -> None:
        """Start a batch with these rows' committed tokens so far (prompt + the first new token).

        `target`: the target's LM right after its prefill of the prompts (the first new token not yet
        fed), for a draft that can take the prompts' KV from it rather than compute its own."""

    def propose(
        self,
        seqs: list[list[int]],
        gamma: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        context: TokenContext | None = None,
        with_q: bool = True,
        done: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Committed tokens per active row -> drafts [B, G] long and q [B, G, V] float32, G = gamma, or fewer
        when `done(token, q)` ([B] bool: the row drafts no more after this draft; a draft-length policy) held
        for every row (a draft may ignore it and draft gamma: the decoder cuts by the same rule).

        `context` is the processors' context of the committed tokens (None when no processor
        reads it); draft i must process its logits with `context` plus drafts 1..i-1.
        `with_q=False`: the caller reads the drafts only (the acceptance rule's greedy form), so q
        is not built and None comes back; the drafts are the same tokens from the same draws.
        """

    def commit(self, accepted: torch.Tensor, accepted_host: list[int]) -> None:
        """Roll back to the committed tokens after `accepted[b]` drafts passed in each row.

        `accepted` is on the device, `accepted_host` the same counts on the host (the
        decoder synced them once this round): use the host list for anything that
        decides a shape or a branch, so a draft adds no host sync of its own.
        """

    def select_rows(self, rows: list[int]) -> None:
        """Keep only these batch rows (indices into the current rows, ascending)."""

    def row_kv_bytes(self) -> int:
        """Bytes of KV cache each current row holds (0 for a draft without a cache)."""


class ModelDraft:
    """A causal LM that shares the target's tokenizer, sampled autoregressively."""

    def __init__(
        self,
        model: PreTrainedModel,
        name: str = "model",
        lm: LM | None = None,
        target_prompt_kv: bool = False,
        target_decode_kv: bool = False,
    ) -> None:
        """`target_prompt_kv`: start from the target's KV of the prompts (`prefill`'s `target`) instead of a
        prefill of this model; only for a model of the target's architecture (a weight-only copy).
        `target_decode_kv` (with it, on the fast path: both LMs `StaticLM`s): after each round, also take the
        K/V the target's verify wrote (`StaticLM.take_columns`), so every committed token's K/V is the target's
        and an all-accepted round needs no catch-up forward for its last draft."""
        self.lm = lm if lm is not None else CachedLM(model)  # the job's forward path, or the eager reference
        self.name = name
        self.target_prompt_kv = target_prompt_kv
        self.target_decode_kv = target_decode_kv
        self.follows: StaticLM | None = None  # the target whose verify K/V this batch takes (target_decode_kv)
        self._starts: list[int] = []  # per active row, the column this round's first fed token went to
        self._gamma = 0
        self.proposed = None

    def prefill(self, prompts: list[list[int]], target: LM | None = None) -> None:
        # The newest committed token is left uncached: every round starts by feeding the
        # row's uncached committed suffix, so the first proposal needs no special case.
        # (The decoder calls this after the first new token, so every row has >= 2 tokens.)
        committed = [ids[:-1] for ids in prompts]
        both_static = isinstance(target, StaticLM) and isinstance(self.lm, StaticLM)
        self.follows = target if self.target_prompt_kv and self.target_decode_kv and both_static else None
        if self.target_prompt_kv and target is not None:
            # A weight-only copy reads the target's KV as well as its own (the decode stays exact whatever
            # the draft's state), and that prefill is done: its own would cost more than the target's
            # (an eager int4 forward) for no gain in acceptance (analysis/fast_path_prompt_kv_cpu_amx/).
            self.lm.prefill_from(target, committed)
        else:
            self.lm.prefill(committed)

    def propose(self, seqs, gamma, sampling, generator, context=None, with_q=True, done=None):
        if self.follows is not None:
            self._starts = self.lm.n_valid_host
        logits = feed_suffix(self.lm, seqs)[:, -1]
        drafts, qs = [], []
        finished = None  # [B] bool: rows whose policy stopped drafting (`done`)
        for i in range(gamma):
            if with_q:
                q = process_logits(logits, sampling, context)  # [B, V]
                token = sample(q, generator, certain=sampling.greedy)  # [B]
                qs.append(self.reported_q(q, logits))
            else:  # the same token, without a [B, V] distribution per step
                token = next_tokens(logits, sampling, context, generator)  # [B]
            drafts.append(token)
            if done is not None and with_q:
                stop = done(token, qs[-1])  # [B]
                finished = stop if finished is None else finished | stop
                count_host_sync()
                if bool(finished.all()):  # a host sync per draft step: only with a policy that reads the draws
                    break
            if i + 1 < gamma:  # the last draft is fed next round, only if accepted
                logits = self.lm.feed(token[:, None])[:, -1]
                context = None if context is None else context.append(token)
        self._gamma = len(drafts)
        return torch.stack(drafts, 1), torch.stack(qs, 1) if with_q else None

    def reported_q(self, q: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The q [B, V] handed to the acceptance test for a draft sampled from `q`: `q` itself. (The one
        seam the lossless audit's `raw_q` variant overrides, so it differs from this draft in that alone.)"""
        return q

    def commit(self, accepted: torch.Tensor, accepted_host: list[int] | None = None) -> None:
        fed = self._gamma - 1  # drafts 1..gamma-1 went through the cache
        if self.follows is not None:
            # The target's verify fed each row's newest committed token and all gamma drafts from the column this
            # round's draft feed started at (the two caches hold the same rows): its K/V of them replaces the
            # draft's, the last draft's included, which the draft never fed, so no two-token catch-up forward
            # follows an all-accepted round (analysis/fast_path_target_decode_kv_cpu_amx_avx2/).
            self.lm.take_columns(self.follows, min(self._starts), max(self._starts) + self._gamma + 1)
            self.lm.keep_last_fed(fed, accepted, accepted_host)
        elif fed:
            keep_host = None if accepted_host is None else [min(a, fed) for a in accepted_host]
            self.lm.keep_last_fed(fed, accepted.clamp(max=fed), keep_host)

    def select_rows(self, rows: list[int]) -> None:
        self.lm.select_rows(rows)

    def row_kv_bytes(self) -> int:
        return self.lm.row_kv_bytes()


class NgramDraft:
    """Prompt lookup: continue the latest earlier occurrence of the row's last n-gram.

    q is one-hot on the proposed token. Under sampling the acceptance test then
    accepts a draft x with probability p(x) and on rejection samples from p with x
    removed, so the output stays exactly p; acceptance is only high where the text
    repeats (summaries, RAG, code edits) and the target is confident.
    """

    def __init__(
        self,
        vocab_size: int,
        max_ngram: int = 3,
        min_ngram: int = 1,
        device: str | torch.device = "cpu",
        fill: bool = True,
    ):
        """`fill`: without a match (or past the match's end) draft the last token again, a cheap guess that is
        verified like any draft; False: propose only the matched tokens (`proposed`), none without a match."""
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(
                f"draft.min_ngram={min_ngram}, draft.max_ngram={max_ngram}: need 1 <= min_ngram <= max_ngram"
            )
        self.name = "ngram"
        self.vocab_size = vocab_size
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.device = torch.device(device)
        self.fill = fill
        self.proposed: list[int] | None = None

    def prefill(self, prompts: list[list[int]], target: LM | None = None) -> None:
        pass

    def lookup(self, seq: list[int], gamma: int) -> list[int]:
        """Tokens that followed the most recent earlier match of the longest suffix n-gram."""
        return self.match(seq, gamma)[0]

    def match(self, seq: list[int], gamma: int) -> tuple[list[int], int]:
        """`lookup`'s gamma tokens and how many of them the match proposes (the rest: the last token again)."""
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            suffix = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):
                if seq[start : start + n] == suffix:
                    follow = seq[start + n : start + n + gamma]
                    return follow + [follow[-1]] * (gamma - len(follow)), len(follow)
        return [seq[-1]] * gamma, 0  # no match: a cheap guess, still verified losslessly

    def propose(self, seqs, gamma, sampling, generator, context=None, with_q=True, done=None):
        matches = [self.match(s, gamma) for s in seqs]
        self.proposed = None if self.fill else [n for _, n in matches]
        drafts = to_device([tokens for tokens, _ in matches], self.device)  # async on CUDA: no sync
        if not with_q:
            return drafts, None
        q = torch.zeros(*drafts.shape, self.vocab_size, device=self.device).scatter_(-1, drafts[..., None], 1.0)
        return drafts, q

    def commit(self, accepted: torch.Tensor, accepted_host: list[int] | None = None) -> None:
        pass

    def select_rows(self, rows: list[int]) -> None:
        pass

    def row_kv_bytes(self) -> int:
        return 0

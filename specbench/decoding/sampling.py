"""The one shared logits processor: p and q are always produced by `process_logits`.

Processors that read the context (repetition, frequency and presence penalties, banned
token sequences) get each position's own context as a `TokenContext`: the committed tokens
plus the drafts before that position, so p and q at draft position i see exactly the
context an autoregressive decoder would have there, and speculation stays lossless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specbench.decoding.timing import to_device

# Settings beyond temperature / top-k / top-p / min-p (the penalties and bans).
CONTEXT_FIELDS = ("repetition_penalty", "frequency_penalty", "presence_penalty", "banned_token_ids", "banned_sequences")


def _number(name: str, value, low: float, high: float, low_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (low < value if low_open else low <= value) and value <= high
    if not ok:
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise ValueError(f"sampling.{name}={value!r}: must be a number in {bound}")


def _token_ids(name: str, ids) -> tuple[int, ...]:
    ids = tuple(ids)
    if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in ids):
        raise ValueError(f"sampling.{name}={list(ids)!r}: token ids must be integers >= 0")
    return ids


@dataclass(frozen=True)
class SamplingConfig:
    """Temperature 0 means greedy (one-hot argmax); top_k 0, top_p 1.0 and min_p 0 disable those filters.

    Penalties and bans act on the logits before temperature (transformers' and vLLM's order):
    `repetition_penalty` (transformers: divide positive / multiply negative logits of every
    token in the context, prompt included; 1.0 = off), `frequency_penalty` / `presence_penalty`
    (OpenAI / vLLM: subtract count x frequency + [count > 0] x presence, counting generated
    tokens only), `banned_token_ids` (never sampled) and `banned_sequences` (the last token
    of a sequence is banned where the context ends with the rest of it).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    banned_token_ids: tuple[int, ...] = ()
    banned_sequences: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(f"sampling.temperature={self.temperature!r}: must be a number >= 0 (0 = greedy)")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"sampling.top_k={self.top_k!r}: must be an integer >= 0 (0 = disabled)")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling.top_p={self.top_p!r}: must be in (0, 1] (1.0 = disabled)")
        _number("min_p", self.min_p, 0.0, 1.0)
        if not isinstance(self.repetition_penalty, (int, float)) or not self.repetition_penalty > 0:
            raise ValueError(
                f"sampling.repetition_penalty={self.repetition_penalty!r}: must be a number > 0 "
                "(1.0 = off, > 1 discourages repeats)"
            )
        _number("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _number("presence_penalty", self.presence_penalty, -2.0, 2.0)
        object.__setattr__(self, "banned_token_ids", _token_ids("banned_token_ids", self.banned_token_ids))
        sequences = tuple(_token_ids("banned_sequences", s) for s in self.banned_sequences)
        if any(len(s) == 0 for s in sequences):
            raise ValueError(f"sampling.banned_sequences={[list(s) for s in sequences]!r}: sequences must be non-empty")
        object.__setattr__(self, "banned_sequences", sequences)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def banned_ids(self) -> tuple[int, ...]:
        """Unconditionally banned tokens: `banned_token_ids` and the one-token `banned_sequences`."""
        return tuple(sorted(set(self.banned_token_ids) | {s[0] for s in self.banned_sequences if len(s) == 1}))

    @property
    def prefix_length(self) -> int:
        """Longest prefix of a multi-token banned sequence: how many trailing context tokens matter."""
        return max((len(s) - 1 for s in self.banned_sequences), default=0)

    @property
    def uses_context(self) -> bool:
        """True when some processor reads the context (then `process_logits` needs a `TokenContext`)."""
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.prefix_length > 0
        )

    def check_vocab(self, vocab_size: int) -> None:
        """Banned ids must be real tokens, and at least one token must stay allowed."""
        ids = set(self.banned_ids) | {t for s in self.banned_sequences for t in s}
        if ids and max(ids) >= vocab_size:
            raise ValueError(
                f"sampling banned tokens {sorted(t for t in ids if t >= vocab_size)}: token ids must be "
                f"in [0, vocab_size={vocab_size})"
            )
        if len(self.banned_ids) >= vocab_size:
            raise ValueError(f"sampling.banned_token_ids: bans all {vocab_size} tokens; at least one must stay allowed")

    def describe(self) -> str:
        """Short label of the non-default settings, e.g. 'T=1 top_k=5 repetition_penalty=1.3'."""
        if self.greedy:
            parts = ["greedy"]
        else:
            parts = [f"T={self.temperature:g}"]
            parts += [f"top_k={self.top_k}"] if self.top_k else []
            parts += [f"top_p={self.top_p:g}"] if self.top_p < 1 else []
            parts += [f"min_p={self.min_p:g}"] if self.min_p > 0 else []
        defaults = SamplingConfig()
        for name in CONTEXT_FIELDS:
            value = getattr(self, name)
            if value != getattr(defaults, name):
                shown = (
                    f"{value:g}"
                    if isinstance(value, float)
                    else str([list(v) if isinstance(v, tuple) else v for v in value]).replace(" ", "")
                )
                parts.append(f"{name}={shown}")
        return " ".join(parts)


@dataclass(frozen=True)
class TokenContext:
    """What the context processors read, per row (and per position after `expand`): leading dims [...].

    `seen` [..., V] bool: tokens anywhere in the context (repetition penalty); `counts`
    [..., V] float32: occurrences among the generated tokens (frequency / presence);
    `tail` [..., L] long: the last L = `prefix_length` tokens, -1 where the context is shorter
    (banned sequences). Fields a config does not use are None.
    """

    seen: torch.Tensor | None
    counts: torch.Tensor | None
    tail: torch.Tensor | None

    @classmethod
    def build(
        cls,
        sampling: SamplingConfig,
        seqs: Sequence[Sequence[int]],
        prompt_lens: Sequence[int],
        vocab_size: int,
        device: torch.device | str,
    ) -> TokenContext | None:
        """Rows' committed tokens (prompt first) -> their context [B, ...]; None when no processor reads it."""
        if not sampling.uses_context:
            return None
        width = max(len(s) for s in seqs)
        padded = to_device([list(s) + [vocab_size] * (width - len(s)) for s in seqs], device)  # [B, W], V = pad
        batch = len(seqs)
        seen = counts = tail = None
        if sampling.repetition_penalty != 1.0:
            seen = torch.zeros(batch, vocab_size + 1, dtype=torch.bool, device=padded.device)
            seen = seen.scatter_(1, padded, True)[:, :vocab_size]
        if sampling.frequency_penalty != 0.0 or sampling.presence_penalty != 0.0:
            generated = torch.arange(width, device=padded.device) >= to_device(list(prompt_lens), device)[:, None]
            ids = torch.where(generated, padded, vocab_size)  # [B, W]
            counts = torch.zeros(batch, vocab_size + 1, device=padded.device)
            counts = counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=counts.dtype))[:, :vocab_size]
        if sampling.prefix_length:
            length = sampling.prefix_length
            tail = to_device([([-1] * length + list(s))[-length:] for s in seqs], device)  # [B, L]
        return cls(seen, counts, tail)

    def append(self, tokens: torch.Tensor) -> TokenContext:
        """The context [B, ...] after one more generated token per row (tokens [B])."""
        seen, counts, tail = self.seen, self.counts, self.tail
        if seen is not None:
            seen = seen.scatter(-1, tokens[:, None], True)
        if counts is not None:
            counts = counts.scatter_add(-1, tokens[:, None], torch.ones_like(counts[:, :1]))
        if tail is not None:
            tail = torch.cat([tail[:, 1:], tokens[:, None]], 1)
        return TokenContext(seen, counts, tail)

    def expand(self, drafts: torch.Tensor) -> TokenContext:
        """Per-position contexts [B, gamma + 1, ...] of a verify step (drafts [B, gamma]).

        Position j adds drafts[:, :j], all at once: the committed [B, V] part plus the cumulative one-hot
        of the drafts along gamma.
        """
        batch, gamma = drafts.shape
        seen = counts = tail = None
        per_token = self.seen if self.seen is not None else self.counts  # [B, V] or None
        if per_token is not None:
            one_hot = torch.zeros(batch, gamma + 1, per_token.shape[-1], device=drafts.device)
            one_hot[:, 1:].scatter_(-1, drafts[..., None], 1.0)
            added = one_hot.cumsum(1)  # [B, gamma + 1, V]: drafts before each position
            if self.seen is not None:
                seen = self.seen[:, None] | (added > 0)
            if self.counts is not None:
                counts = self.counts[:, None] + added
        if self.tail is not None:
            length = self.tail.shape[-1]
            tail = torch.cat([self.tail, drafts], 1).unfold(1, length, 1)  # [B, gamma + 1, L]
        return TokenContext(seen, counts, tail)


def _apply_context(logits: torch.Tensor, sampling: SamplingConfig, context: TokenContext) -> torch.Tensor:
    """Penalties and banned sequences on logits [..., V] with the context of each position."""
    if context.seen is not None:
        rp = sampling.repetition_penalty
        logits = torch.where(context.seen, torch.where(logits < 0, logits * rp, logits / rp), logits)
    if context.counts is not None:
        logits = logits - sampling.frequency_penalty * context.counts
        logits = logits - sampling.presence_penalty * (context.counts > 0).float()
    if context.tail is not None:
        banned = torch.zeros_like(logits, dtype=torch.bool)  # [..., V]
        for seq in sampling.banned_sequences:
            if len(seq) > 1:
                prefix = to_device(list(seq[:-1]), logits.device)  # [m]
                banned[..., seq[-1]] |= (context.tail[..., -len(prefix) :] == prefix).all(-1)  # context ends with it
        logits = logits.masked_fill(banned, float("-inf"))
    return logits


def top_p_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Tokens top-p removes, exactly as transformers' TopPLogitsWarper (same sort, same ties): [..., V] bool.

    Sorted ascending, a token goes when the mass up to and including it is <= 1 - top_p; the
    top token always stays. Which member of a tied group sits at the boundary is decided by
    the same (unstable) `torch.sort` call on a 2-D view, so both keep the same one.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    sorted_logits, order = torch.sort(flat, descending=False)
    remove = sorted_logits.softmax(-1).cumsum(-1) <= (1 - top_p)
    remove[..., -1:] = False
    return remove.scatter(1, order, remove).reshape(logits.shape)


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """The index of the largest entry along the last dim, the first one on ties: [..., V] -> [...].

    `x.max(-1).indices` returns what `argmax(-1)` returns (first on ties, NaN where a row has one; tested),
    but torch's CPU argmax is a slower reduction over a large vocabulary, and a greedy round takes ~11 of
    them (analysis/fast_path_first_argmax_cpu_amx/)."""
    return x.max(-1).indices


def process_logits(logits: torch.Tensor, sampling: SamplingConfig, context: TokenContext | None = None) -> torch.Tensor:
    """Logits [..., V] -> the processed distribution [..., V] (float32) that is actually sampled.

    `context` holds each position's context with the same leading dims (required when
    `sampling.uses_context`). Greedy gives a one-hot argmax, so the general acceptance rule
    reduces to "accept iff the draft equals argmax p" with no special case in the decoder.
    """
    logits = _penalized(logits, sampling, context)
    if sampling.greedy:
        return torch.zeros_like(logits).scatter_(-1, first_argmax(logits)[..., None], 1.0)
    logits = logits / sampling.temperature
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))  # ties with the k-th all stay (transformers too)
    if sampling.top_p < 1.0:
        logits = logits.masked_fill(top_p_mask(logits, sampling.top_p), float("-inf"))
    if sampling.min_p > 0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < sampling.min_p * probs.amax(-1, keepdim=True), float("-inf"))
    return logits.softmax(-1)


def _penalized(logits: torch.Tensor, sampling: SamplingConfig, context: TokenContext | None) -> torch.Tensor:
    """float32 logits after the context processors and bans: what greedy takes the argmax of."""
    logits = logits.float()  # transformers processes float32 logits too
    if sampling.banned_token_ids or sampling.banned_sequences:
        sampling.check_vocab(logits.shape[-1])
    if sampling.uses_context:
        if context is None:
            raise ValueError(f"sampling {sampling.describe()!r} reads the context: process_logits needs a TokenContext")
        logits = _apply_context(logits, sampling, context)
    banned = sampling.banned_ids
    if banned:
        logits = logits.index_fill(-1, to_device(list(banned), logits.device), float("-inf"))
    return logits


def next_tokens(
    logits: torch.Tensor,
    sampling: SamplingConfig,
    context: TokenContext | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """`sample(process_logits(logits, sampling, context), generator)`, [..., V] -> [...], for callers
    that need the token only (not the distribution): under greedy, the argmax of the processed logits,
    without building the one-hot and taking its argmax again (a pass over V saved per step)."""
    if sampling.greedy:
        return first_argmax(_penalized(logits, sampling, context))
    return sample(process_logits(logits, sampling, context), generator)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None, certain: bool = False) -> torch.Tensor:
    """Draw one token per row from probs [..., V] -> [...].

    On CUDA this is `exponential_race`, the algorithm `torch.multinomial` itself uses
    for one sample (same random stream, same tokens) without its two validity
    `.item()` checks, each a host sync; elsewhere `torch.multinomial` (checks included), except
    that rows with one nonzero entry take it without drawing (the generator is not advanced).
    `certain=True`: the caller knows every row is one-hot (`process_logits` under greedy), so the
    argmax is taken without that check (one pass over V fewer).
    """
    flat = probs.reshape(-1, probs.shape[-1])
    if certain:
        return first_argmax(flat).reshape(probs.shape[:-1])
    if flat.is_cuda:
        return exponential_race(flat, generator).reshape(probs.shape[:-1])
    # One nonzero entry per row (greedy's one-hot, or a filter that left one token): the draw is certain.
    # multinomial would still draw a random number per vocabulary entry, the largest part of a greedy
    # step's C_o (analysis/fast_path_2threads_co_cpu_avx512/). Checked on the host: no sync on CPU.
    if bool((flat.count_nonzero(-1) == 1).all()):
        return first_argmax(flat).reshape(probs.shape[:-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def exponential_race(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """argmax_x p(x) / E_x with E_x ~ Exp(1): one draw from probs [B, V] -> [B], no host sync.

    `torch.multinomial(probs, 1)` computes exactly this (its one-sample fast path), so
    both give the same token from the same generator state (tested on CPU).
    """
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    return first_argmax(probs / race)

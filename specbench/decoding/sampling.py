"""The one shared logits processor: p and q are always produced by `process_logits`."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """Temperature 0 means greedy (one-hot argmax); top_k 0 and top_p 1.0 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(f"sampling.temperature={self.temperature!r}: must be a number >= 0 (0 = greedy)")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"sampling.top_k={self.top_k!r}: must be an integer >= 0 (0 = disabled)")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling.top_p={self.top_p!r}: must be in (0, 1] (1.0 = disabled)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def process_logits(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Logits [..., V] -> the processed distribution [..., V] (float32) that is actually sampled.

    Greedy gives a one-hot argmax, so the general acceptance rule reduces to
    "accept iff the draft equals argmax p" with no special case in the decoder.
    """
    logits = logits.float()
    if sampling.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / sampling.temperature
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token when the mass strictly before it already reaches top_p: the
        # smallest prefix with mass >= top_p survives, and the top token always does.
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row from probs [..., V] -> [...].

    On CUDA this is `exponential_race`, the algorithm `torch.multinomial` itself uses
    for one sample (same random stream, same tokens) without its two validity
    `.item()` checks, each a host sync; elsewhere `torch.multinomial` (checks included).
    """
    flat = probs.reshape(-1, probs.shape[-1])
    if flat.is_cuda:
        return exponential_race(flat, generator).reshape(probs.shape[:-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def exponential_race(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """argmax_x p(x) / E_x with E_x ~ Exp(1): one draw from probs [B, V] -> [B], no host sync.

    `torch.multinomial(probs, 1)` computes exactly this (its one-sample fast path), so
    both give the same token from the same generator state (tested on CPU).
    """
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / race).argmax(-1)

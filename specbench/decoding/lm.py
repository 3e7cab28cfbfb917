"""`LM`: the one KV-cache interface the decoder and drafts hold, whichever forward path made it.

`CachedLM` (`kvcache`, the eager reference) and `StaticLM` (`static_kv`, the fast path) both implement
it; `forward.ForwardPath.lm` hands out one or the other. Rows are the batch's active rows, in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class LM(Protocol):
    model: torch.nn.Module
    device: torch.device

    @property
    def vocab_size(self) -> int: ...

    @property
    def n_valid_host(self) -> list[int]:
        """Committed tokens cached per active row."""
        ...

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """A fresh cache for these rows; the logits [B, V] after each prompt."""
        ...

    def prefill_from(self, source: LM, prompts: list[list[int]]) -> None:
        """Start these rows from a copy of `source`'s KV of the same prompts (same architecture and path)."""
        ...

    def feed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append tokens [B, k] to every active row; the logits [B, k, V]."""
        ...

    def uncache_last(self, counts: Sequence[int] | torch.Tensor) -> None:
        """Forget each active row's last `counts[b]` tokens."""
        ...

    def keep_last_fed(
        self, fed: int, keep: torch.Tensor | Sequence[int], keep_host: Sequence[int] | None = None
    ) -> None:
        """Of the last `fed` tokens, keep the first `keep[b]` of each active row."""
        ...

    def select_rows(self, rows: torch.Tensor | Sequence[int]) -> None:
        """Keep only these active rows."""
        ...

    def check_mirrors(self) -> None:
        """AssertionError unless the host mirrors match the cache (tests)."""
        ...

    def row_kv_bytes(self) -> int:
        """Bytes of KV cache each row holds."""
        ...

    def row_kv(self, row: int, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """One active row's committed keys and values [heads, n_valid, d] (tests)."""
        ...

"""The one timer: nothing else in specbench reads a clock.

On CUDA a mark records an event on the current stream (no host sync inside a
round); on CPU it reads `perf_counter`, which is exact because CPU ops run
synchronously. Marks are resolved to seconds in one go by `resolve()`.
"""

from __future__ import annotations

import time

import torch


class PhaseTimer:
    """Records marks; the decoder turns pairs of marks into C_d, C_t, C_o and round times."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._marks: list = []

    def mark(self) -> int:
        """Record a point in time; returns its index for `resolve()`."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())
        return len(self._marks) - 1

    def resolve(self) -> list[float]:
        """Seconds of every mark since the first one (syncs once on CUDA)."""
        if not self._marks:
            return []
        if self.cuda:
            self._marks[-1].synchronize()
            first = self._marks[0]
            return [first.elapsed_time(m) / 1e3 for m in self._marks]
        first = self._marks[0]
        return [m - first for m in self._marks]

    def reset(self) -> None:
        self._marks.clear()

"""The one timer: nothing else in specbench reads a clock. Host syncs are counted here too.

On CUDA a mark records an event on the current stream (no host sync inside a
round); on CPU it reads `perf_counter`, which is exact because CPU ops run
synchronously. Marks are resolved to seconds in one go by `resolve()`.

Host syncs. A CUDA host sync (the CPU waits for the GPU) stops the CPU from
queueing the next kernels while the GPU works, so every one inside a round is
paid in C_o. specbench moves data between host and device only through the two
helpers below, so the syncs of a round can be counted and kept to what the
algorithm needs (one per round: the accepted counts):

* `to_host(*tensors)`: ONE device->host copy of several tensors (one sync on
  CUDA), counted by `host_syncs()`.
* `to_device(data, device)`: a python list -> tensor on `device`. On CUDA it goes
  through pinned memory with `non_blocking=True`: a plain `torch.tensor(data,
  device="cuda")` copies from pageable memory and synchronises the stream.

`host_syncs()` is a process-wide counter of the sync points in specbench's own
code (on CPU as on CUDA); the decoder records its per-round difference as
`RoundRecord.host_syncs`. Syncs hidden inside libraries are not counted here:
on CUDA, `torch.cuda.set_sync_debug_mode("warn")` reports those (tests/test_gpu.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

_host_syncs = 0


def host_syncs() -> int:
    """Host syncs made through `to_host` (and `count_host_sync`) in this process so far."""
    return _host_syncs


def count_host_sync(n: int = 1) -> None:
    """Record `n` explicit host syncs made outside `to_host`."""
    global _host_syncs
    _host_syncs += n


def to_host(*tensors: torch.Tensor) -> list[list]:
    """`[t.tolist() for t in tensors]` with ONE device->host copy (one host sync on CUDA).

    The tensors are flattened into one int64 buffer on the first tensor's device, so
    they must hold integers (token ids, counts); each result keeps its tensor's shape.
    """
    if not tensors:
        return []
    device = tensors[0].device
    flat = torch.cat([t.reshape(-1).to(device=device, dtype=torch.long) for t in tensors])
    count_host_sync()
    values = flat.tolist()
    out, start = [], 0
    for t in tensors:
        out.append(_nest(values[start : start + t.numel()], list(t.shape)))
        start += t.numel()
    return out


def _nest(values: list, shape: list[int]):
    """A flat list -> nested lists of `shape` (what `tolist()` of that shape gives)."""
    if not shape:
        return values[0]
    if len(shape) == 1:
        return values
    step = len(values) // shape[0] if shape[0] else 0
    return [_nest(values[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def to_device(data: Sequence, device: torch.device | str, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A (nested) python list -> tensor on `device` without a host sync.

    On CUDA the list is staged in pinned host memory and copied asynchronously (the
    caching host allocator keeps the buffer alive until the copy has run).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(data, dtype=dtype, device=device)
    return torch.tensor(data, dtype=dtype).pin_memory().to(device, non_blocking=True)


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
            event.record(torch.cuda.current_stream(self.device))
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

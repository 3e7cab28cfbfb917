"""Peak memory of a stretch of work (one job's measured batches): process RSS on CPU, allocator peak on CUDA.

Linux keeps a resident-set high-water mark (VmHWM) per process; writing 5 to
/proc/self/clear_refs resets it, so a sweep's jobs, which share one process and its
loaded models, each get their own peak. Where that reset is refused the peak is the
process's lifetime peak, and `rss_scope` says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def rss_high_water_bytes() -> int | None:
    """VmHWM of this process in bytes (None off Linux)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return None


def reset_rss_high_water() -> bool:
    """Reset VmHWM to the current RSS; False where the kernel or sandbox refuses."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """`with PeakMemory(device) as peak: ...` then `peak.record` = {peak_rss_bytes, peak_cuda_bytes, rss_scope}."""

    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.record: dict[str, Any] = {}

    def __enter__(self) -> PeakMemory:
        self._scoped = reset_rss_high_water()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        self.record = {
            "peak_rss_bytes": rss_high_water_bytes(),
            "peak_cuda_bytes": int(torch.cuda.max_memory_allocated(self.device)) if self.cuda else None,
            "rss_scope": "job" if self._scoped else "process",
        }

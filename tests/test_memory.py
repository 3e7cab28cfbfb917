"""Peak memory per job: the RSS high-water mark is scoped to the measured work, not the process."""

from __future__ import annotations

import pytest
import torch

from specbench.bench.memory import PeakMemory, reset_rss_high_water, rss_high_water_bytes

MB = 1 << 20


@pytest.mark.skipif(rss_high_water_bytes() is None, reason="no /proc/self/status (not Linux)")
def test_peak_rss_sees_an_allocation_and_resets_between_jobs():
    with PeakMemory("cpu") as big:
        x = torch.ones(64 * MB, dtype=torch.float32)  # 256 MiB, touched
        del x
    assert big.record["peak_cuda_bytes"] is None
    if not reset_rss_high_water():
        pytest.skip("this kernel refuses /proc/self/clear_refs: peaks are per process here")
    with PeakMemory("cpu") as small:
        y = torch.ones(4 * MB, dtype=torch.float32)
        del y
    assert big.record["rss_scope"] == small.record["rss_scope"] == "job"
    # The second job's peak does not inherit the first one's 256 MiB.
    assert big.record["peak_rss_bytes"] - small.record["peak_rss_bytes"] > 200 * MB

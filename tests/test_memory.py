"""Peak memory per job: the RSS high-water mark is scoped to the measured work, not the process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from specbench.bench.memory import reset_rss_high_water, rss_high_water_bytes

# In a fresh interpreter: inside a long test session the allocator can serve a 256 MiB tensor
# from memory freed by earlier tests, already resident, and RSS would not grow at all.
_TWO_JOBS = textwrap.dedent(
    """
    import json, torch
    from specbench.bench.memory import PeakMemory
    MB = 1 << 20
    with PeakMemory("cpu") as big:
        x = torch.ones(64 * MB, dtype=torch.float32)  # 256 MiB, touched
        del x
    with PeakMemory("cpu") as small:
        y = torch.ones(4 * MB, dtype=torch.float32)
        del y
    print(json.dumps([big.record, small.record]))
    """
)


@pytest.mark.skipif(rss_high_water_bytes() is None, reason="no /proc/self/status (not Linux)")
def test_peak_rss_sees_an_allocation_and_resets_between_jobs():
    if not reset_rss_high_water():
        pytest.skip("this kernel refuses /proc/self/clear_refs: peaks are per process here")
    out = subprocess.run([sys.executable, "-c", _TWO_JOBS], capture_output=True, text=True, check=True)
    big, small = json.loads(out.stdout.strip().splitlines()[-1])
    assert big["peak_cuda_bytes"] is None
    assert big["rss_scope"] == small["rss_scope"] == "job"
    # The second job's peak does not inherit the first one's 256 MiB.
    assert big["peak_rss_bytes"] - small["peak_rss_bytes"] > 200 * (1 << 20)

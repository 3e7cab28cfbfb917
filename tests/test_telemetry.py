"""GPU telemetry: the unavailable path for real (no mocks), the sampling path on a GPU."""

from __future__ import annotations

import time

import pytest
import torch

from specbench.bench.telemetry import SAMPLE_COLUMNS, GpuTelemetry


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def _check_unavailable(tel: GpuTelemetry) -> None:
    assert tel.available is False
    assert isinstance(tel.reason, str) and tel.reason
    assert tel.summary() == {"available": False, "reason": tel.reason}
    assert tel.summary(new_tokens=10) == {"available": False, "reason": tel.reason}
    s = tel.samples
    assert list(s.columns) == SAMPLE_COLUMNS and s.empty


@pytest.mark.skipif(_nvml_works(), reason="NVML works here: the no-driver path cannot be exercised")
def test_without_nvml_does_not_raise() -> None:
    with GpuTelemetry(interval_s=0.01) as tel:
        time.sleep(0.05)
    _check_unavailable(tel)
    assert "NVML" in tel.reason or "pynvml" in tel.reason


def test_bad_device_index_does_not_raise() -> None:
    # Without NVML: unavailable (no driver). With NVML: unavailable (no such GPU).
    with GpuTelemetry(device=10_000, interval_s=0.01) as tel:
        pass
    _check_unavailable(tel)


def test_usage_errors() -> None:
    with pytest.raises(ValueError):
        GpuTelemetry(interval_s=0)
    tel = GpuTelemetry()
    with tel:
        with pytest.raises(RuntimeError):
            tel.summary()  # still running
    with pytest.raises(RuntimeError):
        tel.start()  # single use
    tel.stop()  # idempotent


def test_exception_in_block_propagates_and_stops() -> None:
    with pytest.raises(KeyError):
        with GpuTelemetry(interval_s=0.01) as tel:
            raise KeyError("boom")
    assert tel._thread is None
    assert tel.summary()["available"] in (True, False)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@gpu
def test_samples_while_gpu_works() -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    with GpuTelemetry("cuda:0", interval_s=0.02) as tel:
        t_end = time.perf_counter() + 1.0
        while time.perf_counter() < t_end:
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
    assert tel.available, tel.reason
    s = tel.samples
    assert len(s) >= 10 and s["t"].is_monotonic_increasing
    summ = tel.summary(new_tokens=1000)
    assert summ["available"] is True and summ["n_samples"] == len(s)
    assert summ["device_name"] == torch.cuda.get_device_name(0)
    assert summ["power_mean_w"] > 0 and summ["power_max_w"] >= summ["power_mean_w"]
    assert summ["mem_used_max_bytes"] >= a.numel() * a.element_size()
    assert summ["sm_util_mean_pct"] > 10
    assert summ["sm_clock_mean_mhz"] > 0
    assert summ["energy_j"] > 0 and summ["energy_source"] in ("counter", "power_integral")
    assert summ["energy_per_token_j"] == pytest.approx(summ["energy_j"] / 1000)
    # energy/time and mean sampled power agree roughly (NVML power is a ~1 s running average)
    assert 1 / 3 < (summ["energy_j"] / summ["duration_s"]) / summ["power_mean_w"] < 3


@pytest.mark.gpu
@gpu
def test_short_block_still_has_two_samples() -> None:
    with GpuTelemetry(0, interval_s=10.0) as tel:
        pass
    assert tel.available, tel.reason
    assert len(tel.samples) == 2
    assert tel.summary()["energy_j"] is not None

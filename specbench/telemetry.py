"""GPU telemetry: power, utilisation, memory and clocks sampled through NVML.

Why: a speedup that costs twice the energy, or a γ that is memory-bound, should
be visible in the report. `GpuTelemetry` samples NVML in a background thread
while a measured block runs; the raw samples (a table, written next to the
rounds) are the record, `summary()` is a convenience for the job's metadata.

Telemetry is never allowed to break a benchmark: without a driver, without
nvidia-ml-py, or with a bad device index it records `available=False` and the
reason instead of raising.

Notes on what NVML reports: `nvmlDeviceGetPowerUsage` is, on Ampere and newer,
an average over roughly the last second, not an instantaneous value, so short
blocks are smeared; the cumulative energy counter
(`nvmlDeviceGetTotalEnergyConsumption`, Volta+) is exact and preferred.
Utilisation is the fraction of the last sample period in which a kernel ran,
not how busy the SMs were.
"""

from __future__ import annotations

import math
import threading
import time
from types import TracebackType
from typing import Any

import numpy as np
import pandas as pd

SAMPLE_COLUMNS = [
    "t",  # seconds since the block started (perf_counter)
    "power_w",
    "sm_util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "sm_clock_mhz",
    "energy_j",  # energy counter since the block started (NaN when unsupported)
]


def _resolve_handle(pynvml: Any, device: Any) -> tuple[Any, int]:
    """NVML handle for `device`: an int is an NVML (physical) index; "cuda:N" or a
    torch.device is mapped through torch's UUID, so CUDA_VISIBLE_DEVICES is honoured."""
    if isinstance(device, int):
        return pynvml.nvmlDeviceGetHandleByIndex(device), device
    text = str(device)
    kind, _, idx = text.partition(":")
    if kind != "cuda":
        raise ValueError(f"GpuTelemetry needs a CUDA device or an NVML index, got {device!r}")
    cuda_index = int(idx) if idx else 0
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
        prefix = "" if uuid.startswith(("GPU-", "MIG-")) else "GPU-"
        handle = pynvml.nvmlDeviceGetHandleByUUID(prefix + uuid)
        return handle, int(pynvml.nvmlDeviceGetIndex(handle))
    except Exception:
        return pynvml.nvmlDeviceGetHandleByIndex(cuda_index), cuda_index


class GpuTelemetry:
    """Context manager sampling one GPU through NVML every `interval_s` seconds.

    >>> with GpuTelemetry("cuda:0", interval_s=0.1) as tel:
    ...     run_the_benchmark()
    >>> tel.samples            # DataFrame, columns SAMPLE_COLUMNS (empty if unavailable)
    >>> tel.summary(new_tokens=4096)

    `device`: an NVML index (int) or "cuda:N"/torch.device (mapped to NVML via
    UUID). A sample is taken at entry, every interval, and at exit, so even a
    block shorter than the interval has two samples.
    """

    def __init__(self, device: Any = 0, interval_s: float = 0.1) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.device = device
        self.interval_s = float(interval_s)
        self.available = False
        self.reason: str | None = "not started"
        self.device_index: int | None = None
        self.device_name: str | None = None
        self.duration_s: float | None = None
        self.sampling_error: str | None = None
        self._rows: list[tuple[float, ...]] = []
        self._nvml: Any = None
        self._handle: Any = None
        self._energy0_mj: float | None = None
        self._t0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._state = "new"  # new -> running -> stopped

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> GpuTelemetry:
        """Initialise NVML and start sampling; on any NVML problem record why and return."""
        if self._state != "new":
            raise RuntimeError("a GpuTelemetry can be started once; create a new one")
        self._state = "running"
        self._t0 = time.perf_counter()
        try:
            import pynvml
        except ImportError as e:
            self.reason = f"nvidia-ml-py (pynvml) not installed: {e}"
            return self
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.reason = f"NVML unavailable: {type(e).__name__}: {e}"
            return self
        self._nvml = pynvml
        try:
            self._handle, self.device_index = _resolve_handle(pynvml, self.device)
            name = pynvml.nvmlDeviceGetName(self._handle)
            self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception as e:
            self.reason = f"NVML device {self.device!r} unusable: {type(e).__name__}: {e}"
            self._shutdown()
            return self
        try:
            self._energy0_mj = float(pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:
            self._energy0_mj = None  # pre-Volta or unsupported: integrate power instead
        self.available, self.reason = True, None
        self._t0 = time.perf_counter()
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="specbench-gpu-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the sampler, take a last sample and release NVML. Idempotent."""
        if self._state != "running":
            return
        self._state = "stopped"
        self.duration_s = time.perf_counter() - self._t0
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.available:
            self._sample()
        self._shutdown()

    def __enter__(self) -> GpuTelemetry:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _shutdown(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None

    # ---------------------------------------------------------------- sampling
    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample()
            except Exception as e:  # GPU lost, driver reset: keep what we have
                self.sampling_error = f"{type(e).__name__}: {e}"
                return

    def _query(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(self._handle, *args)
        except self._nvml.NVMLError:
            return None

    def _sample(self) -> None:
        nv = self._nvml
        t = time.perf_counter() - self._t0
        nan = math.nan
        power = self._query(nv.nvmlDeviceGetPowerUsage)
        util = self._query(nv.nvmlDeviceGetUtilizationRates)
        mem = self._query(nv.nvmlDeviceGetMemoryInfo)
        clock = self._query(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
        energy = (
            self._query(nv.nvmlDeviceGetTotalEnergyConsumption) if self._energy0_mj is not None else None
        )
        self._rows.append(
            (
                t,
                power / 1000.0 if power is not None else nan,
                float(util.gpu) if util is not None else nan,
                float(util.memory) if util is not None else nan,
                float(mem.used) if mem is not None else nan,
                float(clock) if clock is not None else nan,
                (energy - self._energy0_mj) / 1000.0 if energy is not None else nan,
            )
        )

    # ---------------------------------------------------------------- results
    @property
    def samples(self) -> pd.DataFrame:
        """All samples so far (columns SAMPLE_COLUMNS, `t` in seconds from the start)."""
        return pd.DataFrame(list(self._rows), columns=SAMPLE_COLUMNS)

    def summary(self, new_tokens: int | None = None) -> dict[str, Any]:
        """Aggregate the samples of a finished block.

        Energy is the NVML energy-counter difference when supported
        (`energy_source="counter"`), else the trapezoid integral of power over
        time (`"power_integral"`). `energy_per_token_j` needs `new_tokens`.
        Returns `{"available": False, "reason": ...}` when NVML was unusable.
        """
        if self._state == "running":
            raise RuntimeError("summary() is for a finished block: call it after the with-block")
        if not self.available:
            return {"available": False, "reason": self.reason}
        df = self.samples

        def agg(col: str, how: str) -> float | None:
            s = df[col].dropna()
            return float(getattr(s, how)()) if len(s) else None

        energy_j: float | None = None
        source = None
        counter = df["energy_j"].dropna()
        if len(counter):
            energy_j, source = float(counter.iloc[-1]), "counter"
        else:
            p = df[["t", "power_w"]].dropna()
            if len(p) >= 2:
                w, t = p["power_w"].to_numpy(), p["t"].to_numpy()
                energy_j = float(np.sum((w[1:] + w[:-1]) * np.diff(t)) / 2.0)  # trapezoid rule
                source = "power_integral"
        out: dict[str, Any] = {
            "available": True,
            "device_index": self.device_index,
            "device_name": self.device_name,
            "n_samples": len(df),
            "interval_s": self.interval_s,
            "duration_s": self.duration_s,
            "power_mean_w": agg("power_w", "mean"),
            "power_max_w": agg("power_w", "max"),
            "sm_util_mean_pct": agg("sm_util_pct", "mean"),
            "mem_util_mean_pct": agg("mem_util_pct", "mean"),
            "mem_used_max_bytes": agg("mem_used_bytes", "max"),
            "sm_clock_mean_mhz": agg("sm_clock_mhz", "mean"),
            "energy_j": energy_j,
            "energy_source": source,
        }
        if new_tokens is not None:
            out["new_tokens"] = int(new_tokens)
            out["energy_per_token_j"] = (
                energy_j / new_tokens if energy_j is not None and new_tokens > 0 else None
            )
        if self.sampling_error:
            out["sampling_error"] = self.sampling_error
        return out

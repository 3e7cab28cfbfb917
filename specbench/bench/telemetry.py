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
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from specbench.decoding.decoder import DecodeResult

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
        _nvml_shutdown(self._nvml)
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
        energy = self._query(nv.nvmlDeviceGetTotalEnergyConsumption) if self._energy0_mj is not None else None
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
            out["energy_per_token_j"] = energy_j / new_tokens if energy_j is not None and new_tokens > 0 else None
        if self.sampling_error:
            out["sampling_error"] = self.sampling_error
        return out


def _nvml_shutdown(pynvml: Any) -> None:
    """Release NVML if it was initialised; shutting down is best effort."""
    if pynvml is not None:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


TELEMETRY_INTERVAL_S = 0.1


class JobTelemetry:
    """GPU telemetry of a job's measured decoding (not the warm-up), never an error.

    Each measured decode call runs under its own `GpuTelemetry` (a sampling thread), so
    the NVML energy counter gives each decoder's exact energy: `telemetry.json` holds
    per-decoder energy, energy per generated token (whole call, prefill included),
    power, utilisation and clocks, plus one entry per call; `telemetry.parquet` holds
    the raw samples labelled with decoder/repeat/batch/call. `write()` returns the
    compact entry for done.json. Without CUDA or NVML: `{"available": False, "reason"}`
    (and an empty samples table).
    """

    def __init__(self, device: str, interval_s: float = TELEMETRY_INTERVAL_S) -> None:
        self.device, self.interval_s = device, interval_s
        self.calls: list[dict] = []
        self.samples: list[pd.DataFrame] = []
        self.reason = None if str(device).startswith("cuda") else f"not applicable: device {device!r} is not CUDA"
        self._nvml = None
        if self.reason is None:
            try:  # hold NVML open for the job, so each call's nvmlInit is cheap
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception:
                pass  # GpuTelemetry records why

    def run(self, decode: Callable[[], DecodeResult], **labels) -> DecodeResult:
        """Run one measured decode call, sampling NVML while it runs (a no-op off CUDA)."""
        if self.reason is not None:
            return decode()
        with GpuTelemetry(self.device, self.interval_s) as tel:
            result = decode()
        new_tokens = sum(r.new_tokens for r in result.requests)
        self.calls.append({**labels, "call": len(self.calls), **tel.summary(new_tokens=new_tokens)})
        self.samples.append(tel.samples.assign(**labels, call=len(self.calls) - 1))
        return result

    def summary(self) -> dict:
        ok = [c for c in self.calls if c.get("available")]
        if self.reason is not None or not ok:
            reason = self.reason or next((c["reason"] for c in self.calls), "no measured decode calls")
            return {"available": False, "reason": reason}

        def total(cs: list[dict], key: str) -> float | None:
            values = [c.get(key) for c in cs]
            return None if any(v is None for v in values) else float(sum(values))

        def weighted(cs: list[dict], key: str) -> float | None:
            pairs = [(c[key], c["duration_s"]) for c in cs if c.get(key) is not None and c.get("duration_s")]
            seconds = sum(d for _, d in pairs)
            return sum(v * d for v, d in pairs) / seconds if seconds else None

        def block(cs: list[dict]) -> dict:
            energy, tokens = total(cs, "energy_j"), int(sum(c["new_tokens"] for c in cs))
            return {
                "calls": len(cs),
                "new_tokens": tokens,
                "duration_s": total(cs, "duration_s"),
                "energy_j": energy,
                "energy_per_token_j": energy / tokens if energy is not None and tokens else None,
                "power_mean_w": weighted(cs, "power_mean_w"),
                "power_max_w": max((c["power_max_w"] for c in cs if c.get("power_max_w") is not None), default=None),
                "sm_util_mean_pct": weighted(cs, "sm_util_mean_pct"),
                "mem_util_mean_pct": weighted(cs, "mem_util_mean_pct"),
                "sm_clock_mean_mhz": weighted(cs, "sm_clock_mean_mhz"),
                "mem_used_max_bytes": max(
                    (c["mem_used_max_bytes"] for c in cs if c.get("mem_used_max_bytes") is not None), default=None
                ),
            }

        decoders = sorted({c["decoder"] for c in ok})
        return {
            "available": True,
            "device_name": ok[0].get("device_name"),
            "device_index": ok[0].get("device_index"),
            "interval_s": self.interval_s,
            "energy_source": sorted({str(c.get("energy_source")) for c in ok}),
            "unavailable_calls": len(self.calls) - len(ok),
            **block(ok),
            "decoders": {d: block([c for c in ok if c["decoder"] == d]) for d in decoders},
        }

    def write(self, job_dir: Path) -> dict:
        """telemetry.json + telemetry.parquet; returns the compact entry for done.json."""
        _nvml_shutdown(self._nvml)
        self._nvml = None
        summary = self.summary()
        from specbench.bench import runstore

        runstore.write_json(job_dir, "telemetry", {**summary, "calls": self.calls})
        labels = ["decoder", "repeat", "batch", "call"]
        samples = (
            pd.concat(self.samples, ignore_index=True)
            if self.samples
            else pd.DataFrame(columns=SAMPLE_COLUMNS + labels)
        )
        runstore.write_table(job_dir, "telemetry", samples)
        if not summary["available"]:
            return summary
        keep = ("available", "device_name", "energy_j", "new_tokens", "energy_per_token_j", "power_mean_w")
        return {
            **{k: summary[k] for k in keep},
            "energy_per_token_j_by_decoder": {d: b["energy_per_token_j"] for d, b in summary["decoders"].items()},
        }

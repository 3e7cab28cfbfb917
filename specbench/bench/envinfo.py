"""Where and with what a measurement was taken: the environment record of a job.

Why: a timing is meaningless without the machine, library versions and code
commit that produced it, and timing profiles are keyed by hardware (the cost
model joins a timing profile from one machine with an acceptance profile from
another). Everything here is best effort: a missing library, driver or git
repo gives None or `{"available": False, "reason": ...}`, never an exception,
because recording the environment must not kill a benchmark.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import re
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

LIBRARIES = ("torch", "transformers", "hydra-core", "optuna", "pandas", "numpy")


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, str | None]:
    """Installed distribution versions (importlib.metadata, nothing imported); missing -> None."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_model() -> str:
    """CPU model name: /proc/cpuinfo "model name", else sysctl (macOS), else platform.processor()."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


ISA_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_bf16",
    "amx_int8",
)  # the flags that decide which bf16/int8 kernels a CPU runs


def cpu_isa() -> dict[str, Any]:
    """The CPU's vector ISA as it matters for timings: flags present and the kernels torch dispatches to.

    `torch_capability` honours ATEN_CPU_CAPABILITY (e.g. `avx2` forces the AVX2 kernels on an
    AVX-512 machine), so it, not the flags alone, says which code path was measured.
    """
    try:
        import torch

        capability = str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # torch missing or too old: the flags still tell
        capability = None
    return {
        "flags": list(cpu_isa_flags()),
        "torch_capability": capability,
        "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"),
    }


def cpu_class() -> str:
    """'amx', 'avx512' or 'avx2' (else 'other'): the class of bf16/int kernels this machine runs, from the
    CPU flags and ATEN_CPU_CAPABILITY alone (torch is not imported: configs call this before it loads)."""
    flags = set(cpu_isa_flags())
    forced = (os.environ.get("ATEN_CPU_CAPABILITY") or "").lower()
    if forced in ("avx2", "default") or "avx512f" not in flags:
        return "avx2" if "avx2" in flags and forced != "default" else "other"
    return "amx" if "amx_bf16" in flags else "avx512"


@functools.cache
def cpu_isa_flags() -> tuple[str, ...]:
    """The `ISA_FLAGS` this CPU has (/proc/cpuinfo, read once per process; empty where it cannot be read)."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return tuple(f for f in ISA_FLAGS if f in flags)


def isa_label(isa: dict[str, Any] | None = None) -> str:
    """Short ISA tag for labels: torch's kernel level, plus bf16/AMX support when those kernels can use it."""
    isa = isa or cpu_isa()
    level = (isa.get("torch_capability") or ("avx2" if "avx2" in isa["flags"] else "default")).lower()
    extra = {"avx512_bf16": "bf16", "amx_bf16": "amx"}
    tags = [tag for flag, tag in extra.items() if flag in isa["flags"] and level.startswith("avx512")]
    return "+".join([level, *tags])


def usable_cores() -> int | None:
    """CPUs this process may run on (affinity, e.g. under taskset/SLURM), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _memory() -> dict[str, int | None]:
    total = None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        pass
    limit = None  # a container's cgroup limit is what actually OOMs first
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (total is None or int(text) < total):
            limit = int(text)
        break
    return {"total_bytes": total, "cgroup_limit_bytes": limit}


def _str(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def gpu_info() -> dict[str, Any]:
    """GPUs as NVML sees them (physical indices; CUDA_VISIBLE_DEVICES is not applied).

    `{"available": True, "driver", "count", "name", "memory_total_bytes",
    "devices": [{"index", "name", "memory_total_bytes", "uuid"}]}` (`name` and
    `memory_total_bytes` are device 0's), or `{"available": False, "reason"}`.
    """
    try:
        import pynvml
    except ImportError as e:
        return {"available": False, "reason": f"nvidia-ml-py (pynvml) not installed: {e}"}
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound / DriverNotLoaded / ...
        return {"available": False, "reason": f"NVML unavailable: {type(e).__name__}: {e}"}
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            devices.append(
                {
                    "index": i,
                    "name": _str(pynvml.nvmlDeviceGetName(h)),
                    "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    "uuid": _str(pynvml.nvmlDeviceGetUUID(h)),
                }
            )
        return {
            "available": bool(devices),
            **({} if devices else {"reason": "NVML found no devices"}),
            "driver": _str(pynvml.nvmlSystemGetDriverVersion()),
            "count": len(devices),
            "name": devices[0]["name"] if devices else None,
            "memory_total_bytes": devices[0]["memory_total_bytes"] if devices else None,
            "devices": devices,
        }
    except Exception as e:
        return {"available": False, "reason": f"NVML query failed: {type(e).__name__}: {e}"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _torch_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError as e:
        return {"available": False, "reason": f"torch not installed: {e}", "torch_threads": None}
    info: dict[str, Any] = {"torch_threads": torch.get_num_threads()}
    try:
        available = torch.cuda.is_available()
        info.update(
            available=available,
            torch_cuda_version=torch.version.cuda,
            device_count=torch.cuda.device_count() if available else 0,
            visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
        if available:
            info["devices"] = [torch.cuda.get_device_name(i) for i in range(info["device_count"])]
    except Exception as e:
        info.update(available=False, reason=f"{type(e).__name__}: {e}")
    return info


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """`{"commit": sha | None, "dirty": bool | None}` of the git repo holding `path`.

    `path` defaults to this package's directory. The commit is reported only when
    `path` is tracked in that repo, so an installed copy inside some other
    project's `.venv/` does not report that project's commit. Never raises.
    """
    p = Path(path) if path is not None else Path(__file__).resolve().parent
    cwd = p if p.is_dir() else p.parent
    none = {"commit": None, "dirty": None}
    if not cwd.is_dir():
        return none
    commit = _git(["rev-parse", "HEAD"], cwd)
    if not commit or not _git(["ls-files", "--", str(p.resolve())], cwd):
        return none
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def environment_record() -> dict[str, Any]:
    """Everything needed to interpret a timing later; JSON-serialisable; never raises.

    Keys: time (UTC ISO), hostname, python, platform, libraries, cpu
    {model, logical_cores, usable_cores, torch_threads}, memory {total_bytes,
    cgroup_limit_bytes}, cuda {available, torch_cuda_version, device_count, ...},
    gpu (see `gpu_info`), git {commit, dirty}, hardware_label.
    """
    torch_info = _torch_info()
    threads = torch_info.pop("torch_threads", None)
    rec: dict[str, Any] = {
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "libraries": library_versions(),
        "cpu": {
            "model": cpu_model(),
            "logical_cores": os.cpu_count(),
            "usable_cores": usable_cores(),
            "torch_threads": threads,
            "isa": cpu_isa(),
        },
        "memory": _memory(),
        "cuda": torch_info,
        "gpu": gpu_info(),
        "git": git_commit(),
    }
    try:
        rec["hardware_label"] = hardware_label()
    except Exception as e:  # pragma: no cover - defensive: never raise
        rec["hardware_label"] = f"unknown ({type(e).__name__})"
    return rec


def _clean(name: str) -> str:
    name = re.sub(r"\((R|TM|tm|r)\)", "", name)
    return re.sub(r"\s+", " ", name).strip()


def hardware_label(device: Any = None) -> str:
    """Short label keying timing profiles: "cpu:AMD EPYC avx2 x2" or "cuda:NVIDIA H200".

    `device` ("cpu", "cuda", "cuda:1", a torch.device; None = cuda if available
    else cpu) chooses which: a CPU run on a GPU machine is labelled cpu. The CPU
    label counts the cores this process may use (affinity), since that, not the
    socket, sets the timing.
    """
    kind, index = "cpu", 0
    if device is None:
        try:
            import torch

            if torch.cuda.is_available():
                kind = "cuda"
                index = torch.cuda.current_device()
        except Exception:
            pass
    else:
        text = str(device)
        kind, _, idx = text.partition(":")
        index = int(idx) if idx else 0
    if kind == "cpu":  # the ISA is part of the hardware: AVX2-only and AVX-512-bf16 EPYCs time differently
        return f"cpu:{_clean(cpu_model())} {isa_label()} x{usable_cores()}"
    if kind == "cuda":
        try:
            import torch

            return f"cuda:{_clean(torch.cuda.get_device_name(index))}"
        except Exception:
            info = gpu_info()
            return f"cuda:{_clean(info['name'])}" if info.get("available") else "cuda:unknown"
    return kind

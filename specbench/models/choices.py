"""Choices made from timings, made once per machine and software version and kept on disk.

`pair.dtype=auto` on CPU (`loading.fastest_cpu_dtype`), the bf16 linears' gemv and own rows and their prompt
rows' widening (`kernels.gemv_rows`, `own_row_counts`, `upcast_wide`) and the weight-only layers' kernel rows
(`quant.kernel_rows`) are decided by timing kernels. Timed anew in every process, a near-even choice flipped
between jobs of one sweep (and a test comparing two probes failed on a busy machine). So each is timed once, by
the first process that needs it, and its timings and choice are written to `<specbench cache>/choices/<key>.json`;
every later process reads them there.

The key is what changes the timings: the CPU (model and ISA flags), torch's version and threads, the kernel
switches (ATEN_CPU_CAPABILITY, SPECBENCH_CPU_MATVEC), a scope (SPECBENCH_CHOICES_SCOPE: the tests') and a hash of
specbench's kernel and probe sources. Delete the file (or set SPECBENCH_CACHE elsewhere) to time again. The
decision rules themselves are pure functions of the timings (`loading.pick_dtype`, `kernels.pick_gemv_rows`,
`quant.pick_kernel_rows`), tested on given numbers.

`draft.kind=auto` needs no timing: it is a table lookup on the CPU class (`draft_kinds.resolve_kind`),
the same in every process of a machine; jobs record it beside these (`record`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import platform
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from platformdirs import user_cache_dir

from specbench.bench.envinfo import cpu_isa_flags, cpu_model

HERE = Path(__file__).parent
SOURCES = (
    "cpu_matvec.cpp",
    "cpu_attention.cpp",
    "cpu_bf16.cpp",
    "cpu_matvec.py",
    "kernels.py",
    "quant.py",
    "loading.py",
    "choices.py",
)
# SPECBENCH_CHOICES_SCOPE keeps a label's choices apart: the test suite sets "tests", so choices timed at 1 thread
# beside other tests never become a user's 1-thread job's.
SWITCHES = ("ATEN_CPU_CAPABILITY", "SPECBENCH_CPU_MATVEC", "SPECBENCH_CHOICES_SCOPE")
_used: dict[str, dict] = {}  # this process's choices: name -> {"chosen", "timings", "from"}
_thread_lock = threading.RLock()
_depth = 0  # how many `_locked` blocks this process is in (the file lock is taken at the outermost)


def default_cache_dir() -> Path:
    """specbench's cache folder: $SPECBENCH_CACHE, else the platform's user cache folder."""
    return Path(os.environ.get("SPECBENCH_CACHE", user_cache_dir("specbench")))


@functools.cache
def source_hash() -> str:
    """A hash of specbench's kernel and probe sources (a change to any of them times every choice again)."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode() + b"\0" + (HERE / name).read_bytes())
    return digest.hexdigest()[:16]


def machine_key() -> dict[str, Any]:
    """What the cached timings depend on: this machine, this software, this process's kernel settings."""
    import torch

    return {
        "cpu": cpu_model(),
        "arch": platform.machine(),
        "isa": list(cpu_isa_flags()),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "switches": {name: os.environ.get(name) for name in SWITCHES},
        "sources": source_hash(),
    }


def cache_file(key: dict | None = None) -> Path:
    """The JSON file holding the choices made under `key` (this process's `machine_key()` by default)."""
    key = machine_key() if key is None else key
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return default_cache_dir() / "choices" / f"{digest}.json"


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on `path`'s sibling `.lock` between processes (`flock`: released when the process dies,
    however it dies) and between threads; a choice timed while this thread times another reuses the lock."""
    global _depth
    with _thread_lock:
        lock = None
        if _depth == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(path.with_suffix(".lock"), "a")
            fcntl.flock(lock, fcntl.LOCK_EX)
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
            if lock is not None:
                fcntl.flock(lock, fcntl.LOCK_UN)
                lock.close()


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("choices"), dict) else {}


def cached(name: str, measure: Callable[[], dict], decide: Callable[[dict], Any]) -> tuple[Any, dict]:
    """(choice, its timings) for `name`: read from this machine's cache file, or timed now by `measure()`,
    decided by `decide(timings)` (a pure function) and written there. The file is locked while one
    process times, so two processes starting together time once and choose alike."""
    key = machine_key()
    path = cache_file(key)
    with _locked(path):
        data = _read(path) or {"key": key, "choices": {}}
        entry = data["choices"].get(name)
        source = "cache"
        if entry is None:
            timings = measure()
            entry = {"chosen": decide(timings), "timings": timings}
            data = _read(path) or data  # a choice timed inside `measure` may have written the file meanwhile
            data["choices"][name] = entry
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, path)  # readers never see half a file
            source = "measured"
    _used[name] = {**entry, "from": source}
    return entry["chosen"], entry["timings"]


def record() -> dict:
    """The choices this process made or read so far, with the file and key (for a job's done.json)."""
    if not _used:
        return {}
    return {"file": str(cache_file()), "key": machine_key(), "choices": dict(_used)}

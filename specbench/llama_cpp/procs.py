"""Child processes that never outlive the job: llama-server, llama-bench and llama-quantize.

Three guards, because no single one covers every way a job ends:
- a parent-death signal (Linux `prctl(PR_SET_PDEATHSIG, SIGKILL)`, set in the child between fork and exec):
  the kernel kills the child when the job dies for any reason, SIGKILL included;
- while servers run, SIGTERM and SIGHUP (what `timeout`, Slurm and a closed terminal send) stop them first,
  then go on as before (a handler the job had runs; else the job exits 128 + the signal number, unwinding
  its `with` blocks); Ctrl-C is Python's KeyboardInterrupt, which `LlamaServer.start` and the context
  managers already turn into a stop;
- at interpreter exit, whatever is still tracked is stopped.

The parent-death signal follows the thread that started the child: start servers from the thread that
holds them (specbench's jobs do: the main thread).

Server logs live in the temp folder as `llama-server-<job pid>-*.log`, removed when the server stops; a
killed job cannot remove its own, so each start removes those of jobs that no longer run.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1  # linux/prctl.h
HANDLED = (signal.SIGTERM, signal.SIGHUP)
LOG_PREFIX = "llama-server-"
LOG_NAME = re.compile(r"^llama-server-(\d+)-.*\.log$")  # a kept log (`keep_log`) says "failed" instead of a pid

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_live: dict[int, Callable[[], None]] = {}  # id(owner) -> its stop(); what a signal or exit must stop
_previous: dict[int, object] = {}  # signal -> the job's handler before ours


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel SIGKILL the child when this thread's process dies (None off Linux)."""
    if _libc is None:
        return None
    parent = os.getpid()
    prctl = _libc.prctl  # looked up before fork: the child only calls it

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the job died before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def new_log() -> Path:
    """An empty log file for one server in the temp folder, named after this job's pid."""
    sweep_logs()
    fd, path = tempfile.mkstemp(prefix=f"{LOG_PREFIX}{os.getpid()}-", suffix=".log")
    os.close(fd)
    return Path(path)


def keep_log(path: Path) -> Path:
    """Rename a failed start's log so sweeps leave it alone; print where it is on stderr; return its new path."""
    kept = path.with_name(path.name.replace(f"{LOG_PREFIX}{os.getpid()}-", f"{LOG_PREFIX}failed-", 1))
    try:
        os.replace(path, kept)
    except OSError:
        return path
    print(f"specbench: llama-server failed to start; its log is kept at {kept}", file=sys.stderr)
    return kept


def sweep_logs(folder: Path | None = None) -> list[Path]:
    """Remove server logs left in `folder` (the temp folder) by jobs no longer running; returns them."""
    removed = []
    for path in Path(folder or tempfile.gettempdir()).glob(f"{LOG_PREFIX}*.log"):
        match = LOG_NAME.match(path.name)
        if match and not _running(int(match.group(1))):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge
    return True


def track(owner: object, stop: Callable[[], None]) -> None:
    """Have `stop` run on SIGTERM, SIGHUP and interpreter exit until `untrack(owner)`."""
    _live[id(owner)] = stop
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; the parent-death signal still covers this child
    for sig in HANDLED:
        if sig not in _previous:
            previous = signal.getsignal(sig)
            if previous is signal.SIG_IGN or previous is None:
                continue  # the job ignores it (or it was set outside Python): it does not end the job
            _previous[sig] = previous
            signal.signal(sig, _on_signal)


def untrack(owner: object) -> None:
    """Forget `owner`; with nothing left to stop, give the job its own handlers back."""
    _live.pop(id(owner), None)
    if not _live:
        _restore()


def stop_all() -> None:
    """Stop every tracked server (each stop is idempotent)."""
    for stop in list(_live.values()):
        try:
            stop()
        except Exception as exc:  # noqa: BLE001 - the next one must still be stopped
            print(f"specbench: stopping a llama-server failed: {exc}", file=sys.stderr)
    _live.clear()


def _restore() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    while _previous:
        sig, previous = _previous.popitem()
        if signal.getsignal(sig) is _on_signal:
            signal.signal(sig, previous)


def _on_signal(signum: int, frame) -> None:
    previous = _previous.get(signum, signal.SIG_DFL)
    stop_all()
    _restore()
    if callable(previous):
        previous(signum, frame)
        return
    raise SystemExit(128 + signum)


atexit.register(stop_all)

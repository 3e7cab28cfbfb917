"""An exclusive claim on a job folder, so two workers never run (and write) the same job.

Why: two terminals, two Slurm tasks or two machines on a shared `runs/` may start the same
sweep. The claim is `<job>/.specbench/claim.lock`, created atomically (O_CREAT | O_EXCL, which
NFS v3+ honours too) and holding the claimant's host, boot id, pid and process start time. A
worker that finds a live claim skips the job; the holder refreshes the file's mtime every
`HEARTBEAT_S` while it runs. A claim is stale when its holder is on this host (same host name
and boot id) and that process is gone (or the pid now names another process), or, on another
host, when its mtime is older than `STALE_AFTER_S`. A stale claim is moved aside by an atomic
rename and re-read; only the worker that moved the very claim it judged stale takes the job.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from specbench.bench.runstore import MARK_DIR, PathLike

CLAIM_FILE = "claim.lock"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 15 * 60.0  # a claim from another host not refreshed for this long is abandoned


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def me() -> dict[str, Any]:
    """This worker, as a claim records it."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid": pid, "start": _start_time(pid)}


def describe(holder: dict[str, Any]) -> str:
    return f"{holder.get('host')}:{holder.get('pid')} since {holder.get('time')}"


def _alive(holder: dict[str, Any]) -> bool:
    """Is the process a claim names (on this host) still the one that took it?"""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's
    start = _start_time(pid)
    return holder.get("start") is None or start is None or start == holder.get("start")


def is_stale(holder: dict[str, Any], mtime: float, now: float | None = None) -> bool:
    here = me()
    if holder.get("host") == here["host"] and holder.get("boot_id") == here["boot_id"]:
        return not _alive(holder)
    return (time.time() if now is None else now) - mtime > STALE_AFTER_S


def _read(path: Path) -> tuple[dict[str, Any], float] | None:
    try:
        text, mtime = path.read_text(encoding="utf-8"), path.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        return json.loads(text), mtime
    except ValueError:  # written but not yet filled (claims are a few bytes, written at once): judge by age
        return {}, mtime


class Claim:
    """A held claim: `release()` (or leaving the `with` block) removes it; a thread refreshes it."""

    def __init__(self, path: Path, record: dict[str, Any]) -> None:
        self.path, self.record = path, record
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"claim {path.parent.parent.name}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                return

    def release(self) -> None:
        self._stop.set()
        found = _read(self.path)
        if found is not None and found[0] == self.record:  # still ours (never remove a successor's)
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def try_claim(job_dir: PathLike) -> Claim | dict[str, Any]:
    """Claim the job folder: a `Claim`, or the record of the live worker holding it."""
    mark = Path(job_dir) / MARK_DIR
    mark.mkdir(parents=True, exist_ok=True)
    path = mark / CLAIM_FILE
    for _ in range(10):
        record = {**me(), "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            found = _read(path)
            if found is None:
                continue  # released meanwhile: try again
            holder, mtime = found
            if not is_stale(holder, mtime):
                return holder
            aside = path.with_name(f"{CLAIM_FILE}.stale.{os.getpid()}")
            try:
                os.rename(path, aside)
            except FileNotFoundError:
                continue
            moved = _read(aside)
            if moved is not None and moved[0] != holder:  # moved a fresh claim, not the stale one: put it back
                try:
                    os.link(aside, path)
                except FileExistsError:
                    pass
            aside.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        return Claim(path, record)
    raise RuntimeError(f"could not claim {job_dir}: its claim file keeps changing (10 tries)")

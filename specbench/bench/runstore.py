"""The run store: one directory per job, `runs/<sweep>/<job>/`, written crash-safely.

Why: sweeps run for hours, jobs die (OOM, `kill -9`, a pre-empted SLURM node), and a report must be regenerable
from `runs/` alone. So every file is written atomically (temp file in the same directory, fsync, `os.replace`):
a reader sees the old file, the new file, or nothing. `done.json` is written LAST; a job directory without it
is incomplete, and `prepare_job_dir` wipes its leftovers before a re-run so rows are never duplicated. Only
files specbench wrote are ever deleted: `prepare_job_dir` marks a job folder with `.specbench/`, every write
into it is listed in `.specbench/written` first, and a non-empty folder without the mark is refused.

Layout of a job directory::

    runs/<sweep>/<job>/
        config.yaml, env.json, ...   # anything written with write_text / write_json
        rounds.parquet, ...          # tables (raw rows, see specbench.decoding.records)
        failure.json                 # only if the last attempt failed (not done)
        done.json                    # written last: the job is complete
        .specbench/written           # the names written here (what a re-run may delete)
        .specbench/claim.lock        # the worker running the job (specbench.bench.claims)
Jobs may sit at any depth under the sweep directory; `load_sweep` finds them.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import errno
import fnmatch
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import pandas as pd

DONE_FILE = "done.json"
FAILURE_FILE = "failure.json"
TABLE_SUFFIX = ".parquet"
TMP_PREFIX = ".tmp."  # temp files: ".tmp.<final name>.<random>", removed by prepare_job_dir

# Files prepare_job_dir keeps in an incomplete job dir: Hydra's job log (its `.hydra/` is a dir: never touched).
DEFAULT_KEEP: tuple[str, ...] = ("*.log",)

# The mark of a job folder prepare_job_dir made, with the list of files written into it.
MARK_DIR = ".specbench"
WRITTEN_FILE = "written"
# What a folder may hold without being foreign: Hydra writes `.hydra/` and its log before the job starts.
HYDRA_ENTRIES = (".hydra", MARK_DIR)

PathLike = str | os.PathLike[str]


class ForeignDirError(Exception):
    """A job folder that holds files specbench did not write (no `.specbench/` mark): never touched."""


_RESERVED = {DONE_FILE, FAILURE_FILE}


# --------------------------------------------------------------------------- writing


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _fsync_dir(path: Path) -> None:
    """Persist a rename: fsync the directory entry (best effort; not on Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Write `path` via a temp file in the same dir + fsync + os.replace.

    Same directory so the rename stays atomic. On any error (KeyboardInterrupt too) the temp file
    is removed; on SIGKILL it stays behind, named `.tmp.*`, and `prepare_job_dir` removes it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    _note_written(path)
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def _note_written(path: Path) -> None:
    """In a marked job folder, list `path`'s name before it exists, so a re-run may delete it."""
    mark = path.parent / MARK_DIR
    if mark.is_dir():
        with open(mark / WRITTEN_FILE, "a", encoding="utf-8") as f:
            f.write(path.name + "\n")


def _check_name(name: str, suffix: str = "") -> str:
    """Validate a file name (no directories, not hidden) and add `suffix` if missing."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"bad file name {name!r}: a plain, non-hidden name without '/' is required")
    if suffix and not name.endswith(suffix):
        name += suffix
    return name


def write_table(job_dir: PathLike, name: str, df: pd.DataFrame) -> Path:
    """Atomically write `df` to `<job_dir>/<name>.parquet` (index dropped: rows are records)."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"write_table expects a pandas DataFrame, got {type(df).__name__}")
    path = Path(job_dir) / _check_name(name, TABLE_SUFFIX)
    return _atomic_write(path, lambda f: df.to_parquet(f, index=False))


def _json_default(obj: Any) -> Any:
    """Make common non-JSON values serialisable: numpy scalars/arrays, paths, dataclasses, dtypes."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if hasattr(obj, "tolist"):  # numpy scalars and arrays, torch tensors
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=str)
    if isinstance(obj, (_dt.datetime, _dt.date)):
        return obj.isoformat()
    return str(obj)  # Path, torch.dtype, enums, ...


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n").encode()


def write_json(job_dir: PathLike, name: str, obj: Any) -> Path:
    """Atomically write `obj` as JSON to `<job_dir>/<name>.json`.

    `done.json` and `failure.json` are reserved: use `mark_done` / `write_failure`.
    """
    fname = _check_name(name, ".json")
    if fname in _RESERVED:
        raise ValueError(f"{fname} is reserved: use mark_done() or write_failure()")
    data = _dumps(obj)  # serialise first: a bad object must not leave a temp file
    return _atomic_write(Path(job_dir) / fname, lambda f: f.write(data))


def write_text(job_dir: PathLike, filename: str, text: str) -> Path:
    """Atomically write `text` (UTF-8) to `<job_dir>/<filename>`, e.g. `config.yaml`."""
    fname = _check_name(filename)
    if fname in _RESERVED:
        raise ValueError(f"{fname} is reserved: use mark_done() or write_failure()")
    data = text.encode("utf-8")
    return _atomic_write(Path(job_dir) / fname, lambda f: f.write(data))


def mark_done(job_dir: PathLike, meta: Mapping[str, Any] | None = None) -> Path:
    """Declare the job complete: write `done.json` (meta + `finished_at`), atomically, last. A `failure.json`
    of an earlier try is removed first (a crash in between leaves an incomplete job, simply re-run)."""
    job = Path(job_dir)
    record = {**dict(meta or {}), "finished_at": _utc_now()}
    data = _dumps(record)
    try:
        (job / FAILURE_FILE).unlink()
    except FileNotFoundError:
        pass
    return _atomic_write(job / DONE_FILE, lambda f: f.write(data))


def is_done(job_dir: PathLike) -> bool:
    """True when the job finished: `done.json` exists (it is only ever written whole)."""
    return (Path(job_dir) / DONE_FILE).is_file()


_OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory", "defaultcpuallocator")
_OOM_MESSAGES += ("cublas_status_alloc_failed",)


def is_oom(exc: BaseException) -> bool:
    """Is this exception (or one it was raised `from`) an out-of-memory error? torch's OutOfMemoryError,
    MemoryError, OSError ENOMEM, and RuntimeErrors whose message is an allocator's (`_OOM_MESSAGES`)."""
    torch = sys.modules.get("torch")  # not imported => cannot be a torch OOM; don't import it
    torch_oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if torch_oom is not None and isinstance(e, torch_oom):
            return True
        if isinstance(e, MemoryError):
            return True
        if isinstance(e, OSError) and e.errno == errno.ENOMEM:
            return True
        if isinstance(e, (RuntimeError, OSError)) and any(s in str(e).lower() for s in _OOM_MESSAGES):
            return True
        e = e.__cause__
    return False


def write_failure(job_dir: PathLike, exc: BaseException, kind: str | None = None, extra: Mapping | None = None) -> Path:
    """Record why the job failed in `failure.json` (atomically). The job stays not done.

    `kind` is a short class such as "oom" or "error"; None infers it with `is_oom`.
    `extra` (optional) is merged in, e.g. the batch size that ran out of memory.
    """
    if kind is None:
        kind = "oom" if is_oom(exc) else "error"
    record = {
        **dict(extra or {}),
        "kind": kind,
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "time": _utc_now(),
    }
    data = _dumps(record)
    return _atomic_write(Path(job_dir) / FAILURE_FILE, lambda f: f.write(data))


def check_job_dir(job_dir: PathLike, keep: Iterable[str] = DEFAULT_KEEP) -> Path:
    """Raise ForeignDirError when `job_dir` holds anything but specbench's and Hydra's files and has no
    `.specbench/` mark (a folder specbench did not make: its files are not ours to delete)."""
    job = Path(job_dir)
    if job.exists() and not job.is_dir():
        raise NotADirectoryError(f"job dir {job} exists and is not a directory")
    if not job.is_dir() or (job / MARK_DIR).is_dir() or is_done(job):
        return job
    foreign = sorted(
        e.name
        for e in job.iterdir()
        if e.name not in HYDRA_ENTRIES and not (e.is_file() and any(fnmatch.fnmatch(e.name, k) for k in keep))
    )
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise ForeignDirError(
            f"{job} is not empty and not a specbench job folder (no {MARK_DIR}/ mark; it holds {shown}): "
            "refusing to write into it; choose a new or empty folder"
        )
    return job


def prepare_job_dir(job_dir: PathLike, force: bool = False, keep: Iterable[str] = DEFAULT_KEEP) -> bool:
    """Get a job dir ready to run; return False when it is already done (and not `force`).

    A done job is left untouched unless `force`. Otherwise the directory is created and
    marked (`.specbench/`) if needed, and the top-level files specbench wrote there
    (stale tables, json, temp files, `failure.json`, `done.json` when forced) are removed,
    so a re-run starts clean and never duplicates rows. Files specbench did not write,
    subdirectories and files matching a `keep` glob (Hydra's `*.log`) are left alone;
    a non-empty folder without the mark raises ForeignDirError (see `check_job_dir`).
    """
    job = check_job_dir(job_dir, keep)
    if is_done(job) and not force:
        return False
    (job / MARK_DIR).mkdir(parents=True, exist_ok=True)
    keep = tuple(keep)
    # Remove done.json first: if we die mid-cleanup the job must not look complete.
    try:
        (job / DONE_FILE).unlink()
    except FileNotFoundError:
        pass
    written = job / MARK_DIR / WRITTEN_FILE
    ours = set(written.read_text(encoding="utf-8").split("\n")) if written.is_file() else set()
    for entry in job.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            continue
        if entry.name.startswith(TMP_PREFIX) or (
            entry.name in ours and not any(fnmatch.fnmatch(entry.name, k) for k in keep)
        ):
            try:
                entry.unlink()
            except FileNotFoundError:
                pass
    written.write_text("", encoding="utf-8")
    return True


# --------------------------------------------------------------------------- reading


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _check_sweep_dir(sweep_dir: PathLike) -> Path:
    root = Path(sweep_dir)
    if not root.is_dir():
        parent = root.parent if str(root.parent) else Path(".")
        near = sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []
        hint = f"; directories in {parent}: {', '.join(near)}" if near else ""
        raise FileNotFoundError(
            f"sweep directory {root} does not exist (jobs are written to runs/<sweep>/<job>/){hint}"
        )
    return root


def _job_dirs(root: Path, marker: str) -> list[Path]:
    return sorted(p.parent for p in root.rglob(marker) if p.is_file())


def _rel(root: Path, job: Path) -> str:
    return job.relative_to(root).as_posix() or "."


class CorruptTableError(ValueError):
    """A finished job's table that cannot be read (truncated, not parquet): named, never skipped as missing."""


def load_sweep(sweep_dir: PathLike, table: str = "rounds") -> pd.DataFrame:
    """`<table>.parquet` of every DONE job under `sweep_dir` (any depth), with a first column `job` (its dir relative
    to `sweep_dir`); unfinished and failed jobs are left out (`load_failures`). FileNotFoundError without the dir,
    ValueError when no finished job has the table (saying what there is), CorruptTableError naming an unreadable one."""
    root = _check_sweep_dir(sweep_dir)
    fname = _check_name(table, TABLE_SUFFIX)
    done = _job_dirs(root, DONE_FILE)
    frames = []
    for job in done:
        path = job / fname
        if path.is_file():
            try:
                df = pd.read_parquet(path)
            except Exception as exc:  # pyarrow's ArrowInvalid is a ValueError: keep it apart from "no table"
                why = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
                raise CorruptTableError(
                    f"{path}: unreadable table ({why}); re-run that job with force=true, or move it out of the sweep"
                ) from exc
            df.insert(0, "job", _rel(root, job))
            frames.append(df)
    if not frames:
        failed = [j for j in _job_dirs(root, FAILURE_FILE) if not is_done(j)]
        if done:
            tables = sorted({p.name for j in done for p in j.glob(f"*{TABLE_SUFFIX}")})
            raise ValueError(
                f"none of the {len(done)} finished jobs under {root} has {fname}; "
                f"tables present: {', '.join(tables) or 'none'}"
            )
        started = {p.parent for p in root.rglob(f"*{TABLE_SUFFIX}")} | set(failed)
        incomplete = [j for j in started if not is_done(j) and j not in failed]
        raise ValueError(
            f"no finished jobs under {root} (no {DONE_FILE} found): "
            f"{len(failed)} failed (see load_failures), {len(incomplete)} incomplete "
            f"(interrupted or still running; re-run the sweep to finish them)"
        )
    non_empty = [f for f in frames if len(f)] or frames[:1]
    return pd.concat(non_empty, ignore_index=True)


def load_meta(sweep_dir: PathLike) -> pd.DataFrame:
    """One row per DONE job: its `done.json` (nested keys flattened with dots) plus `job`."""
    root = _check_sweep_dir(sweep_dir)
    rows = []
    for job in _job_dirs(root, DONE_FILE):
        meta = json.loads((job / DONE_FILE).read_text())
        rows.append({"job": _rel(root, job), **_flatten(meta)})
    return pd.DataFrame(rows, columns=None if rows else ["job"])


FAILURE_COLUMNS = ["job", "kind", "type", "message", "time", "traceback"]


def load_failures(sweep_dir: PathLike) -> pd.DataFrame:
    """One row per failed job (has `failure.json`, no `done.json`) under `sweep_dir`.

    Columns: job, kind, type, message, time, traceback (+ any `extra` keys).
    Empty (with those columns) when nothing failed.
    """
    root = _check_sweep_dir(sweep_dir)
    rows = []
    for job in _job_dirs(root, FAILURE_FILE):
        if is_done(job):
            continue
        rec = json.loads((job / FAILURE_FILE).read_text())
        rows.append({"job": _rel(root, job), **rec})
    df = pd.DataFrame(rows)
    for c in FAILURE_COLUMNS:
        if c not in df.columns:
            df[c] = pd.Series(dtype=object)
    return df[FAILURE_COLUMNS + [c for c in df.columns if c not in FAILURE_COLUMNS]]

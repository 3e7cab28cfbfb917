"""The jobs a report leaves out: failed ones (`failure.json`) and unfinished ones (started, never done).

A report is computed from finished jobs only; this lists the others, with why, so a reader sees that the
sweep is incomplete instead of reading a smaller sweep as a whole one.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specbench.bench.runstore import DONE_FILE, FAILURE_FILE, TABLE_SUFFIX, load_failures
from specbench.report.render import Section

JOB_MARKERS = ("config.yaml", "env.json", ".hydra")  # what a started job's folder holds (specbench's, Hydra's)
COLUMNS = ["job", "status", "detail"]


def _started(root: Path) -> set[Path]:
    """Folders under `root` where a job started: a marker or a table, outside hidden folders."""
    found = set()
    for pattern in (*JOB_MARKERS, f"*{TABLE_SUFFIX}"):
        for path in root.rglob(pattern):
            rel = path.relative_to(root).parts
            if any(part.startswith(".") for part in rel[:-1]):
                continue
            found.add(path.parent)
    return found


def left_out_jobs(sweep_dir) -> pd.DataFrame:
    """One row per job the report leaves out: (job, status 'failed' | 'unfinished', detail)."""
    root = Path(sweep_dir)
    rows = []
    failures = load_failures(root)
    for rec in failures.to_dict("records"):
        message = " ".join(str(rec.get("message", "")).split())
        rows.append({"job": rec["job"], "status": "failed", "detail": f"{rec.get('kind', 'error')}: {message}"})
    failed = set(failures["job"])
    for job in sorted(_started(root)):
        if (job / DONE_FILE).is_file() or (job / FAILURE_FILE).is_file():
            continue
        name = job.relative_to(root).as_posix() or "."
        if name in failed:
            continue
        tables = sorted(p.stem for p in job.glob(f"*{TABLE_SUFFIX}"))
        detail = f"no {DONE_FILE}: interrupted, still running or never started"
        rows.append(
            {
                "job": name,
                "status": "unfinished",
                "detail": detail + (f" (tables: {', '.join(tables)})" if tables else ""),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def jobs_note(jobs: pd.DataFrame) -> str | None:
    """'N failed and M unfinished jobs are not in this report ...', or None when every job finished."""
    if jobs is None or not len(jobs):
        return None
    counts = jobs["status"].value_counts()
    return (
        f"{counts.get('failed', 0)} failed and {counts.get('unfinished', 0)} unfinished jobs are not in this report "
        "(see 'Jobs not in this report'); re-run the sweep's command to retry them"
    )


def jobs_section(jobs: pd.DataFrame) -> Section | None:
    """The section listing the left-out jobs, or None when there are none."""
    note = jobs_note(jobs)
    if note is None:
        return None
    return Section(
        "Jobs not in this report",
        text=[
            "Every table and figure of this report is computed from the finished jobs only. These jobs failed "
            "(their failure.json says why) or never finished, so their settings are missing from it."
        ],
        tables=[("left-out jobs", jobs)],
        notes=[note],
    )

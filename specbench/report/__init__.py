"""Sweep report: markdown + self-contained HTML + PNG plots, computed from raw rows.

    python -m specbench.report runs/<sweep> [--out DIR] [--ct PATH]

`build_report(rounds, requests, ct, out_dir)` does all the work from DataFrames;
`load_tables(sweep_dir)` is the only place that touches the run store.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import pandas as pd

from specbench.deploy.plan import write_deployment
from specbench.report.data import ReportData, report_meta
from specbench.report.engines_view import engines_sections, engines_tables
from specbench.report.jobs import jobs_section, left_out_jobs
from specbench.report.render import render_html, render_md
from specbench.report.sections import build_sections, save_png

PLOT_DPI = 100


def _read_table(path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--ct {path}: no such file (a .parquet, .csv or .json C_t(k) table)")
    read = {".csv": pd.read_csv, ".json": pd.read_json}.get(path.suffix, pd.read_parquet)
    try:
        return read(path)
    except Exception as exc:  # a truncated or foreign file: name it
        raise ValueError(f"--ct {path}: unreadable table ({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc


def _optional_table(sweep_dir, name: str) -> pd.DataFrame | None:
    """A sweep's table that finished jobs may lack (None then); an unreadable one is an error naming its file."""
    from specbench.bench.runstore import CorruptTableError, load_sweep

    try:
        return load_sweep(sweep_dir, name)
    except CorruptTableError:
        raise
    except ValueError:  # no finished job wrote this table
        return None


def load_tables(sweep_dir, ct=None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """(rounds, requests, ct) of a sweep via `specbench.bench.runstore.load_sweep`.

    `ct` may be a DataFrame, a path (.parquet/.csv/.json) or None; None tries the sweep's
    own "ct" and "llama_ct" tables (stacked: their rows never match each other's settings) and uses
    None (C_t from the rounds) if it has neither.
    """
    from specbench.bench.runstore import load_sweep

    rounds = load_sweep(sweep_dir, "rounds")
    requests = load_sweep(sweep_dir, "requests")
    if ct is None:  # specbench's C_t(k) micro-benchmark; llama.cpp's llama-bench rows (neither: from the rounds)
        frames = [_optional_table(sweep_dir, name) for name in ("ct", "llama_ct")]
        frames = [f for f in frames if f is not None and len(f)]
        ct = pd.concat(frames, ignore_index=True) if frames else None
    elif not isinstance(ct, pd.DataFrame):
        ct = _read_table(ct)
    return rounds, requests, ct


def build_report(
    rounds: pd.DataFrame,
    requests: pd.DataFrame,
    ct: pd.DataFrame | None = None,
    out_dir="report",
    *,
    title: str | None = None,
    gamma_max: int = 16,
    meta: pd.DataFrame | None = None,
    floor: pd.DataFrame | None = None,
    jobs: pd.DataFrame | None = None,
) -> dict:
    """Compute every table once from the raw rows and write report.md, report.html (self-
    contained: plots embedded as data URIs), the PNG plots, tables/<name>.{csv,json} and, with
    two or more batch sizes, deploy/ (γ schedule + engine files) into out_dir.

    `jobs`: the sweep's failed and unfinished jobs (`report.jobs.left_out_jobs`), listed in their own section.
    Returns {"markdown": Path, "html": Path, "figures": [Path], "tables": [Path], "deploy": [Path],
    "notes": [str]}.
    """
    if isinstance(gamma_max, bool) or not isinstance(gamma_max, int) or gamma_max < 1:
        raise ValueError(f"gamma_max={gamma_max!r}: must be an integer >= 1")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = ReportData.compute(rounds, requests, ct, gamma_max=gamma_max, meta=meta, floor=floor)
    deploy = []
    if data.schedules:  # engine files follow the first metric's schedule (throughput)
        deploy = write_deployment(next(iter(data.schedules.values())), out_dir / "deploy")
    # every engine vs every baseline
    engines = engines_tables(data.requests, data.rounds, data.hardware_limit, data.timing)
    tables = write_tables({**data.tables(), **engines}, out_dir / "tables")
    links = [p.relative_to(out_dir).as_posix() for p in deploy]
    sections, notes = build_sections(data, save_png(out_dir, PLOT_DPI), links)
    sections[1:1] = engines_sections(engines)
    left_out = jobs_section(jobs)
    if left_out is not None:  # right after the summary: the reader must know the sweep is incomplete
        sections.insert(1, left_out)
        notes = [*left_out.notes, *notes]
    meta = {"generated": _dt.datetime.now().isoformat(timespec="seconds"), **report_meta(data)}
    title = title or "Speculative decoding report"
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    md_path.write_text(render_md(title, meta, sections), encoding="utf-8")
    html_path.write_text(render_html(title, meta, sections, out_dir), encoding="utf-8")
    figures = [out_dir / name for s in sections for name, _ in s.figures]
    return {
        "markdown": md_path,
        "html": html_path,
        "figures": figures,
        "tables": tables,
        "deploy": deploy,
        "notes": notes,
    }


def write_tables(tables: dict[str, pd.DataFrame], out_dir: Path) -> list[Path]:
    """Each table as <name>.csv and <name>.json (records; NaN -> null) for scripts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, df in tables.items():
        df.to_csv(out_dir / f"{name}.csv", index=False)
        df.to_json(out_dir / f"{name}.json", orient="records", indent=2, force_ascii=False)
        paths += [out_dir / f"{name}.csv", out_dir / f"{name}.json"]
    return paths


def write_report(sweep_dir, out_dir=None, ct=None, **kw) -> dict:
    """Load a sweep's tables (see `load_tables`) and `build_report` into out_dir
    (default: <sweep_dir>/report)."""
    sweep_dir = Path(sweep_dir)
    rounds, requests, ct = load_tables(sweep_dir, ct)
    kw.setdefault("title", f"Speculative decoding report: {sweep_dir.name}")
    from specbench.bench.runstore import load_meta

    if "floor" not in kw:
        kw["floor"] = _optional_table(sweep_dir, "floor")  # the hardware-limit probe (jobs with ct_bench)
    if "jobs" not in kw:
        kw["jobs"] = left_out_jobs(sweep_dir)
    if "meta" not in kw:
        try:
            kw["meta"] = load_meta(sweep_dir)  # read for the peak-memory hook
        except (ValueError, FileNotFoundError):
            kw["meta"] = None
    return build_report(rounds, requests, ct, out_dir or sweep_dir / "report", **kw)

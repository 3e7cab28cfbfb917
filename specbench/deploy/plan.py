"""The one path from request rows to deployment files, shared by `python -m specbench.deploy` and the report.

`plan_schedules(requests, metric)` computes the paired speedup per (setting, batch size, γ) and the γ
schedule per batch size; `write_deployment(schedules, out_dir, ...)` writes schedule.{md,csv,json}
and one file per engine (`specbench.deploy.engines.ENGINES`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from specbench.analysis.speedup import latency_speedup, throughput_speedup
from specbench.analysis.stats import MEDIAN_CI_METHOD
from specbench.deploy.engines import DeployContext, write_engine_files
from specbench.deploy.schedule import SCHEDULE_KEYS, Schedule, build_schedules, schedule_markdown
from specbench.registry import Registry

# Which measured speedup a schedule optimises: per-request latency or per-batch throughput.
SPEEDUP_METRICS: Registry = Registry("metric")
SPEEDUP_METRICS.register("latency", latency_speedup)
SPEEDUP_METRICS.register("throughput", throughput_speedup)
# Batch throughput is what a serving deployment trades against batch size (at B = 1 the two agree).
DEFAULT_METRIC = "throughput"


def speedup_table(requests: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Paired speedup per (setting, batch size, γ) of request rows as `add_gamma_setting` returns them
    (`gamma` = each job's γ), with a median CI (`specbench.analysis.speedup`)."""
    measure = SPEEDUP_METRICS.get(metric, "metric")
    for col in ("gamma", "batch_size"):
        if col not in requests.columns:
            raise ValueError(
                f"request rows need column {col!r} (see analysis.rows.add_gamma_setting); "
                f"got {sorted(requests.columns)}"
            )
    keys = [k for k in SCHEDULE_KEYS if k in requests.columns] + ["batch_size", "gamma"]
    table = measure(requests, keys)
    if table.empty:
        raise ValueError(
            "no speculative request has a paired autoregressive baseline (run the sweep with baseline=true)"
        )
    return table


def plan_schedules(requests: pd.DataFrame, metric: str = DEFAULT_METRIC) -> list[Schedule]:
    """γ schedules per setting (see `specbench.deploy.schedule`) from the paired request rows."""
    return build_schedules(speedup_table(requests, metric), metric)


def _slug(setting: dict) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", ",".join(f"{k}={v}" for k, v in setting.items()))[:120] or "all"


def write_deployment(
    schedules: list[Schedule],
    out_dir: str | Path,
    target: str | None = None,
    draft: str | None = None,
    max_batch_size: int | None = None,
    policy: str = "fixed",
    tau: float = 0.0,
) -> list[Path]:
    """Write schedule.{md,csv,json} and every engine's file (one subfolder per setting when there are
    several) into out_dir; returns the written paths, schedule files first."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metric = schedules[0].metric if schedules else "?"
    note = (
        f"Speedups: paired against plain decoding, {metric}; CI: {MEDIAN_CI_METHOD}, 95%. "
        "γ per batch size: the best measurably faster γ (whole CI above 1), else off.\n\n"
    )
    paths = [out_dir / "schedule.md", out_dir / "schedule.csv", out_dir / "schedule.json"]
    paths[0].write_text("# γ schedule\n\n" + note + schedule_markdown(schedules), encoding="utf-8")
    pd.concat([s.to_frame() for s in schedules], ignore_index=True).to_csv(paths[1], index=False)
    as_json = json.dumps([s.to_dict() for s in schedules], indent=2, allow_nan=False)
    paths[2].write_text(as_json + "\n", encoding="utf-8")
    for s in schedules:
        ctx = DeployContext.from_setting(
            s.setting, target, draft, max_batch_size=max_batch_size, policy=policy, tau=tau
        )
        paths += write_engine_files(s, ctx, out_dir if len(schedules) == 1 else out_dir / _slug(s.setting))
    return paths

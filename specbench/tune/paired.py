"""Paired statistics of tuner trials, from their request rows (the rows sweep jobs write).

Unit of pairing: a prompt batch. Every configuration is measured on the same batches with
the same seeds, each batch paired with its own AR run, so two configurations compare batch by
batch: d_b = log(u_A(b) / u_B(b)), u = the batch's paired speedup (repeats, and the requests
of a batch for latency objectives, averaged as a geometric mean *before* pairing).

* indistinguishable: two-sided Wilcoxon signed-rank test on d_b (`scipy.stats.wilcoxon`);
* pruning: one-sided paired t-test (`scipy.stats.ttest_1samp` on d_b) of "worse by more than
  the margin", mean d_b < log(1 - margin); the pruner Bonferroni-splits its level over its looks.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from specbench.analysis.rows import ar_mask
from specbench.analysis.speedup import batch_throughput, paired_requests
from specbench.tune.objectives import OBJECTIVES

# Request-row columns a trial keeps in its Optuna user attribute `requests` (the rest are its job keys).
TRIAL_COLUMNS = ["decoder", "repeat", "batch", "row", "prompt_id", "new_tokens", "wall_time", "ttft"]


def compact(requests: pd.DataFrame) -> dict[str, list]:
    """Request rows -> a JSON-safe column dict of `TRIAL_COLUMNS` (an Optuna user attribute)."""
    return {c: [v.item() if hasattr(v, "item") else v for v in requests[c]] for c in TRIAL_COLUMNS}


def expand(stored: dict[str, list] | None, job: str) -> pd.DataFrame:
    """A `compact` dict -> request rows with a `job` column (the unit `analysis.speedup` pairs within)."""
    df = pd.DataFrame(stored or {c: [] for c in TRIAL_COLUMNS}, columns=TRIAL_COLUMNS)
    return df.assign(job=job)


def _geomean(x: pd.Series) -> float:
    return float(np.exp(np.log(x).mean()))


def unit_speedups(requests: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Per unit (batch, or batch + prompt for latency): the paired speedup, geometric mean over
    (job, repeat). Columns: batch, [prompt_id,] speedup."""
    if requests.empty:
        return pd.DataFrame(columns=["batch", "speedup"])
    if kind == "throughput_speedup":
        bt = batch_throughput(requests)
        on = [c for c in ("job", "repeat", "batch") if c in bt.columns]
        ar = bt[ar_mask(bt)][on + ["tok_s"]].rename(columns={"tok_s": "ar_tok_s"})
        pairs = bt[~ar_mask(bt)].merge(ar, on=on)
        pairs["speedup"] = pairs["tok_s"] / pairs["ar_tok_s"]
        unit = ["batch"]
    else:
        pairs = paired_requests(requests, "wall").rename(columns={"ratio": "speedup"})
        unit = ["batch", "prompt_id"]
    pairs = pairs[np.isfinite(pairs["speedup"]) & (pairs["speedup"] > 0)]
    return pairs.groupby(unit)["speedup"].agg(_geomean).reset_index()


def batch_speedups(requests: pd.DataFrame, objective: str) -> pd.Series:
    """Per batch: the objective's paired speedup (geometric mean of its units), indexed by batch."""
    u = unit_speedups(requests, OBJECTIVES.get(objective, "tune.objective").speedup)
    return u.groupby("batch")["speedup"].agg(_geomean) if len(u) else pd.Series(dtype=float)


def objective_value(requests: pd.DataFrame, objective: str, reference: dict) -> float:
    """The objective over request rows: reduction of the unit speedups × the study reference."""
    obj = OBJECTIVES.get(objective, "tune.objective")
    u = unit_speedups(requests, obj.speedup)
    if u.empty:
        return math.nan
    scale = 1.0
    if obj.reference is not None:
        ref = reference.get(obj.reference)
        scale = float(ref) if ref is not None and math.isfinite(float(ref)) and ref > 0 else 1.0
    return scale * obj.reduction(u["speedup"].to_numpy(float))


def reference_throughput(requests: pd.DataFrame) -> float:
    """AR tokens/s: Σ AR batch tokens ÷ Σ AR batch walls (a batch's wall is its slowest row's)."""
    bt = batch_throughput(requests)
    ar = bt[ar_mask(bt)]
    wall = float(ar["wall"].sum())
    return float(ar["tokens"].sum()) / wall if wall > 0 else math.nan


def reference_latency(requests: pd.DataFrame) -> float:
    """AR seconds per token: median over AR requests of wall_time / new_tokens."""
    ar = requests[ar_mask(requests)]
    tpt = (ar["wall_time"] / ar["new_tokens"].where(ar["new_tokens"] > 0)).dropna()
    return float(tpt.median()) if len(tpt) else math.nan


def log_ratios(a: pd.Series | dict, b: pd.Series | dict) -> np.ndarray:
    """d_b = log(a_b / b_b) over the batches both measured (finite, positive values only)."""
    a, b = pd.Series(a, dtype=float), pd.Series(b, dtype=float)
    common = a.index.intersection(b.index)
    x, y = a[common].to_numpy(float), b[common].to_numpy(float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    return np.log(x[ok] / y[ok])


def paired_p(a: pd.Series | dict, b: pd.Series | dict) -> float:
    """Two-sided Wilcoxon signed-rank p of per-batch paired log ratios (NaN without common batches)."""
    d = log_ratios(a, b)
    if len(d) == 0:
        return math.nan
    if not np.any(d != 0):
        return 1.0
    return float(stats.wilcoxon(d).pvalue)


def worse_p(trial: pd.Series | dict, best: pd.Series | dict, margin: float) -> float:
    """One-sided paired t-test p of "trial is worse than best by more than `margin`" on the
    common batches: H1 mean log(trial_b / best_b) < log(1 - margin). NaN with < 2 batches."""
    d = log_ratios(trial, best)
    if len(d) < 2:
        return math.nan
    threshold = math.log1p(-margin)
    if np.ptp(d) == 0:  # no spread: the t statistic is ±inf (or undefined at the threshold)
        return 0.0 if d[0] < threshold else 1.0
    return float(stats.ttest_1samp(d, threshold, alternative="less").pvalue)

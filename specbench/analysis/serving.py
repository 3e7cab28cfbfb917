"""Serving metrics as engines report them, computed from raw rows (see `specbench.decoding.records`).

What users compare against vLLM / SGLang dashboards: mean acceptance length, its histogram,
per-position acceptance (both the conditional α_i specbench fits and vLLM's unconditional
rate), per-request acceptance, and TTFT / TPOT / end-to-end latency percentiles.

Every function is pure: DataFrames in, DataFrames out. `by` is the grouping (a column name or
a list); None groups by the setting columns present (`SETTING_COLUMNS`). Round rows of the
autoregressive baseline (and rows that drafted nothing) never enter the acceptance metrics.

Percentiles use `numpy.percentile(..., method="linear")` (numpy's default: linear
interpolation between the two closest ranks, so P50 of [1, 2, 3, 4] is 2.5).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from specbench.analysis.rows import decode_phase, group_keys, iter_groups, spec_rows

# Columns that identify one measured setting (present ones are used; `gamma_setting` is a job's γ).
SETTING_COLUMNS = (
    "pair",
    "target",
    "draft",
    "workload",
    "sampling",
    "hardware",
    "dtype",
    "batch_size",
    "gamma_setting",
    "decoder",
)
# Columns that identify one request across round rows.
REQUEST_ID_COLUMNS = ("job", "decoder", "repeat", "batch", "row", "prompt_id")
PERCENTILE_METHOD = "linear"  # numpy's default interpolation, named so reports can state it
LATENCY_METRICS = ("ttft", "tpot", "e2e")


def drafting_rounds(rounds: pd.DataFrame) -> pd.DataFrame:
    """Round rows that drafted (gamma > 0) of any decoder but the autoregressive baseline; checks accepted."""
    for col in ("gamma", "accepted"):
        if col not in rounds.columns:
            raise ValueError(f"round rows need column {col!r}; got {sorted(rounds.columns)}")
    rows = spec_rows(rounds)
    bad = (rows["accepted"] < 0) | (rows["accepted"] > rows["gamma"])
    if bad.any():
        first = rows[bad].iloc[0]
        raise ValueError(
            f"accepted={int(first['accepted'])} with gamma={int(first['gamma'])}: "
            f"accepted must lie in [0, gamma] ({int(bad.sum())} rows)"
        )
    return rows


# --------------------------------------------------------------------------- acceptance length


def mean_acceptance_length(rounds: pd.DataFrame, by: str | Iterable[str] | None = None) -> pd.DataFrame:
    """Mean acceptance length per group, vLLM's definition: 1 + Σaccepted / Σdrafting rounds.

    It counts the recovered/bonus token of every round, so plain decoding scores 1.0.
    Columns: by + [rounds, drafted, accepted, mean_acceptance_length, draft_acceptance_rate]
    (draft_acceptance_rate = Σaccepted / Σgamma, vLLM's "draft acceptance rate").
    """
    rows = drafting_rounds(rounds)
    keys = group_keys(rows, by, SETTING_COLUMNS)
    out = []
    for kd, sub in iter_groups(rows, keys):
        n, acc, drafted = len(sub), int(sub["accepted"].sum()), int(sub["gamma"].sum())
        out.append(
            {
                **kd,
                "rounds": n,
                "drafted": drafted,
                "accepted": acc,
                "mean_acceptance_length": 1.0 + acc / n,
                "draft_acceptance_rate": acc / drafted,
            }
        )
    return pd.DataFrame(
        out, columns=keys + ["rounds", "drafted", "accepted", "mean_acceptance_length", "draft_acceptance_rate"]
    )


def acceptance_length_histogram(rounds: pd.DataFrame, by: str | Iterable[str] | None = None) -> pd.DataFrame:
    """Histogram of the acceptance length (accepted + 1) per group, every length 1..max γ + 1 listed.

    Columns: by + [acceptance_length, count, fraction]; each group's counts sum to its rounds
    and its fractions to 1.
    """
    rows = drafting_rounds(rounds)
    keys = group_keys(rows, by, SETTING_COLUMNS)
    out = []
    for kd, sub in iter_groups(rows, keys):
        lengths = sub["accepted"].to_numpy(int) + 1
        counts = np.bincount(lengths, minlength=int(sub["gamma"].max()) + 2)[1:]  # index 0 is impossible
        for length, c in enumerate(counts, start=1):
            out.append({**kd, "acceptance_length": length, "count": int(c), "fraction": c / len(lengths)})
    return pd.DataFrame(out, columns=keys + ["acceptance_length", "count", "fraction"])


# --------------------------------------------------------------------------- per-position acceptance


def acceptance_by_position(rounds: pd.DataFrame, by: str | Iterable[str] | None = None) -> pd.DataFrame:
    """Per-position acceptance in both forms engines and papers use; they differ, so both are labelled.

    For draft position i, over the rounds that drafted it (gamma ≥ i):
      * `conditional_acceptance` = P(accepted ≥ i | accepted ≥ i−1) — specbench's α_i, the chance
        the draft survives position i once it reached it (the cost model's Π α_j uses these);
      * `unconditional_acceptance` = #rounds with accepted ≥ i / #rounds that drafted position i —
        vLLM's per-position acceptance rate; it is the product of the conditional ones up to i.
    Columns: by + [position, drafted, reached, accepted, conditional_acceptance,
    unconditional_acceptance] (reached = drafted rounds with accepted ≥ i−1).
    """
    rows = drafting_rounds(rounds)
    keys = group_keys(rows, by, SETTING_COLUMNS)
    out = []
    for kd, sub in iter_groups(rows, keys):
        a, g = sub["accepted"].to_numpy(int), sub["gamma"].to_numpy(int)
        for i in range(1, int(g.max()) + 1):
            drafted = g >= i
            n_drafted = int(drafted.sum())
            reached = int((drafted & (a >= i - 1)).sum())
            passed = int((drafted & (a >= i)).sum())
            out.append(
                {
                    **kd,
                    "position": i,
                    "drafted": n_drafted,
                    "reached": reached,
                    "accepted": passed,
                    "conditional_acceptance": passed / reached if reached else np.nan,
                    "unconditional_acceptance": passed / n_drafted,
                }
            )
    return pd.DataFrame(
        out,
        columns=keys
        + ["position", "drafted", "reached", "accepted", "conditional_acceptance", "unconditional_acceptance"],
    )


# --------------------------------------------------------------------------- per-request acceptance


def request_acceptance(rounds: pd.DataFrame, by: str | Iterable[str] | None = None) -> pd.DataFrame:
    """Acceptance of each request: Σaccepted / Σgamma over its drafting rounds.

    A request is one row of one batch of one decoder run (REQUEST_ID_COLUMNS present).
    Columns: by + request ids + [rounds, drafted, accepted, acceptance].
    """
    rows = drafting_rounds(rounds)
    keys = group_keys(rows, by, SETTING_COLUMNS)
    ids = [c for c in REQUEST_ID_COLUMNS if c in rows.columns and c not in keys]
    if not ids:
        raise ValueError(
            f"round rows need request id columns (some of {list(REQUEST_ID_COLUMNS)}) to tell "
            f"requests apart; got {sorted(rows.columns)}"
        )
    agg = (
        rows.groupby(keys + ids, dropna=False, sort=True)
        .agg(rounds=("accepted", "size"), drafted=("gamma", "sum"), accepted=("accepted", "sum"))
        .reset_index()
    )
    agg["acceptance"] = agg["accepted"] / agg["drafted"]
    return agg[keys + ids + ["rounds", "drafted", "accepted", "acceptance"]]


def request_acceptance_summary(
    rounds: pd.DataFrame, by: str | Iterable[str] | None = None, percentiles: Sequence[float] = (5, 50, 95)
) -> pd.DataFrame:
    """Distribution of per-request acceptance across requests: mean and percentiles (default P5/P50/P95).

    Columns: by + [requests, mean, p5, p50, p95] (one p<q> column per requested percentile).
    """
    per_request = request_acceptance(rounds, by)
    keys = group_keys(drafting_rounds(rounds), by, SETTING_COLUMNS)
    out = []
    for kd, sub in iter_groups(per_request, keys):
        x = sub["acceptance"].to_numpy(float)
        out.append({**kd, "requests": len(x), "mean": float(x.mean()), **_percentiles(x, percentiles)})
    return pd.DataFrame(out, columns=keys + ["requests", "mean"] + [_pcol(q) for q in percentiles])


# --------------------------------------------------------------------------- latency


def _pcol(q: float) -> str:
    return f"p{q:g}".replace(".", "_")


def _percentiles(x: np.ndarray, qs: Sequence[float]) -> dict[str, float]:
    if len(x) == 0:
        return {_pcol(q): np.nan for q in qs}
    vals = np.percentile(x, list(qs), method=PERCENTILE_METHOD)
    return {_pcol(q): float(v) for q, v in zip(qs, vals)}


def request_latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """Add per-request latencies (seconds): `ttft`, `tpot` = (wall − ttft) / (new_tokens − first chunk), `e2e` = wall.

    TPOT (time per output token after the first chunk, `rows.decode_phase`) is NaN where that phase is empty.
    """
    for col in ("wall_time", "ttft", "new_tokens"):
        if col not in requests.columns:
            raise ValueError(f"request rows need column {col!r}; got {sorted(requests.columns)}")
    out = requests.copy()
    seconds, tokens = decode_phase(out)
    out["tpot"] = seconds / tokens
    out["e2e"] = out["wall_time"]
    return out


def latency_percentiles(
    requests: pd.DataFrame,
    by: str | Iterable[str] | None = None,
    percentiles: Sequence[float] = (50, 95, 99),
) -> pd.DataFrame:
    """TTFT, TPOT and end-to-end latency per group (decoder included by default): mean and percentiles.

    One row per group and metric (`ttft`, `tpot`, `e2e`; seconds). Columns: by + [metric, n, mean,
    p50, p95, p99]; n counts the requests with a defined value (TPOT needs ≥ 2 new tokens).
    Percentiles: numpy, linear interpolation (PERCENTILE_METHOD).
    """
    lat = request_latencies(requests)
    keys = group_keys(lat, by, SETTING_COLUMNS)
    out = []
    for kd, sub in iter_groups(lat, keys):
        for metric in LATENCY_METRICS:
            x = sub[metric].to_numpy(float)
            x = x[np.isfinite(x)]
            out.append(
                {
                    **kd,
                    "metric": metric,
                    "n": len(x),
                    "mean": float(x.mean()) if len(x) else np.nan,
                    **_percentiles(x, percentiles),
                }
            )
    return pd.DataFrame(out, columns=keys + ["metric", "n", "mean"] + [_pcol(q) for q in percentiles])

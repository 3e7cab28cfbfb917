"""The one-screen summary table and the per-workload recommendations, from raw rows."""

from __future__ import annotations

import math

import pandas as pd

from specbench.analysis.acceptance import AcceptanceProfile
from specbench.analysis.rows import add_gamma_setting, group_keys, iter_groups, setting_rows, spec_rows
from specbench.analysis.speedup import (
    best_to_deploy,
    deploy_label,
    latency_speedup,
    optimal_gamma,
    speedup_verdict,
    throughput_speedup,
)
from specbench.analysis.timing import TimingProfile
from specbench.analysis.validation import request_terms

SUMMARY_KEYS = ("target", "draft", "decoder", "workload", "sampling", "max_new_tokens", "batch_size", "gamma")
SUMMARY_VALUES = (
    "acceptance",
    "accept_length",
    "spec_tok_s",
    "ar_tok_s",
    "latency_speedup",
    "latency_speedup_lo",
    "latency_speedup_hi",
    "n_prompts",
    "throughput_speedup",
    "throughput_speedup_lo",
    "throughput_speedup_hi",
    "n_batches",
)
# Column headers of the two measured speedups (the statistic and the CI, see stats.median_ci).
LATENCY_HEADER = "latency speedup: median [95% CI] n prompts"
THROUGHPUT_HEADER = "throughput speedup: median [95% CI] n batches"


def format_ci(s, lo, hi, n=None) -> str:
    """'1.52× [1.40, 1.61] n=12'; '[–]' where n is too small for the CI's level."""
    if pd.isna(s):
        return "–"
    tail = "" if n is None or pd.isna(n) else f" n={int(n)}"
    if pd.isna(lo):
        return f"{s:.2f}× [–]{tail}"
    return f"{s:.2f}× [{lo:.2f}, {hi:.2f}]{tail}"


def summary_table(
    rounds: pd.DataFrame,
    requests: pd.DataFrame,
    by=None,
    *,
    confidence: float = 0.95,
    latency: pd.DataFrame | None = None,
    throughput: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per setting: acceptance, accept length, tokens/s, latency and throughput speedups.

    `by` defaults to the present SUMMARY_KEYS ("gamma" = the job's γ setting). Columns: by +
    [acceptance (Σaccepted/Σgamma), accept_length (mean accepted+1), spec_tok_s, ar_tok_s
    (per request: Σ new tokens / Σ wall time over the paired requests), latency_speedup(_lo,
    _hi), n_prompts (end-to-end, see `latency_speedup`), throughput_speedup(_lo, _hi),
    n_batches (see `throughput_speedup`)]. `latency` / `throughput`: those tables already
    computed by the same keys (a report computes them once).
    """
    rounds, requests = add_gamma_setting(rounds, requests)
    keys = group_keys(requests, by, SUMMARY_KEYS)
    lat = latency if latency is not None else latency_speedup(requests, keys, basis="wall", confidence=confidence)
    if throughput is None and "batch" in requests.columns:
        throughput = throughput_speedup(requests, keys, confidence=confidence)
    out = lat.drop(columns=["n_pairs"], errors="ignore")
    if throughput is not None and len(throughput):
        thr = throughput.drop(columns=["spec_tok_s", "ar_tok_s"])
        out = out.merge(thr, on=keys, how="left") if keys else pd.concat([out, thr], axis=1)
    sp = spec_rows(rounds).rename(columns={"gamma": "gamma_row", "gamma_setting": "gamma"})
    rk = [k for k in keys if k in sp.columns]
    acc = []
    for kd, sub in iter_groups(sp, rk):
        acc.append(
            {
                **kd,
                "acceptance": sub["accepted"].sum() / sub["gamma_row"].sum(),
                "accept_length": float((sub["accepted"] + 1).mean()),
            }
        )
    acc = pd.DataFrame(acc, columns=rk + ["acceptance", "accept_length"])
    out = out.merge(acc, on=rk, how="left") if rk else out.assign(**(acc.iloc[0].to_dict() if len(acc) else {}))
    cols = keys + list(SUMMARY_VALUES)
    for c in cols:
        if c not in out.columns:
            out[c] = math.nan
    return out[cols]


def format_summary(df: pd.DataFrame) -> str:
    """The summary table as one screen of text (key columns with one value go to a header line)."""
    if df.empty:
        return "(no paired speculative/autoregressive requests)"
    header = []
    if len(df) > 1:
        const = [c for c in df.columns if c not in SUMMARY_VALUES and df[c].nunique(dropna=False) == 1]
        header = [", ".join(f"{c}={df[c].iloc[0]}" for c in const)] if const else []
        df = df.drop(columns=const)
    t = pd.DataFrame(index=df.index)
    for c in df.columns:
        if c == "acceptance":
            t["accept"] = df[c].map(lambda v: "-" if pd.isna(v) else f"{100 * v:.1f}%")
        elif c == "accept_length":
            t["E[N]"] = df[c].map(lambda v: "-" if pd.isna(v) else f"{v:.2f}")
        elif c in ("spec_tok_s", "ar_tok_s"):
            t[{"spec_tok_s": "spec tok/s", "ar_tok_s": "AR tok/s"}[c]] = df[c].map(lambda v: f"{v:.1f}")
        elif c == "latency_speedup":
            t[LATENCY_HEADER] = [format_ci(*v) for v in zip(df[c], df[f"{c}_lo"], df[f"{c}_hi"], df["n_prompts"])]
        elif c == "throughput_speedup":
            t[THROUGHPUT_HEADER] = [format_ci(*v) for v in zip(df[c], df[f"{c}_lo"], df[f"{c}_hi"], df["n_batches"])]
        elif c == "gamma":
            t["γ"] = df[c].map(lambda v: "-" if pd.isna(v) else str(int(v)))
        elif c not in SUMMARY_VALUES:
            t[c] = df[c]
    return "\n".join(header + [t.to_string(index=False)])


def recommendations(
    rounds: pd.DataFrame,
    requests: pd.DataFrame,
    ct: pd.DataFrame | None = None,
    by=("workload", "batch_size"),
    *,
    gamma_max: int = 16,
    measured: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per `by` (plus target/sampling/hardware/dtype if they vary): the measured best
    (decoder, draft, γ) by median end-to-end latency speedup — the best measurably faster one
    when any is (`best_to_deploy`) —, its CI and n, a verdict
    ('faster' if the CI lies above 1, 'slower' if below, else 'not significant'), and the
    truncation-aware cost model's optimal γ for that draft with its predicted decode speedup.
    `deploy` is 'off' (γ = 0, plain decoding) unless the best is measurably faster.
    `measured`: a `latency_speedup(..., basis='wall')` table at least as fine as by + choice."""
    rounds, requests = add_gamma_setting(rounds, requests)
    by = [k for k in by if k in requests.columns]
    for k in ("target", "sampling", "hardware", "dtype"):
        if k in requests.columns and k not in by and requests[k].nunique(dropna=False) > 1:
            by.append(k)
    choice = [k for k in ("decoder", "draft", "gamma") if k in requests.columns]
    meas = measured if measured is not None else latency_speedup(requests, by + choice, basis="wall")
    out = []
    for kd, sub in iter_groups(meas, by):
        if sub["latency_speedup"].isna().all():
            continue
        best = sub.loc[best_to_deploy(sub, "latency_speedup")]
        lo, hi = best["latency_speedup_lo"], best["latency_speedup_hi"]
        verdict = speedup_verdict(lo, hi)
        sel = {**kd, **{k: best[k] for k in choice if k != "gamma"}}
        rows = setting_rows(rounds, sel)
        gopt, sopt = (0, math.nan)
        if not spec_rows(rows).empty:
            try:
                acc, tim = AcceptanceProfile.from_rounds(rows), TimingProfile.from_rounds(rows, ct, context=False)
                gopt, sopt = optimal_gamma(acc, tim, gamma_max, **request_terms(requests, sel))
            except ValueError:  # mixed timing settings inside this selection
                pass
        out.append(
            {
                **kd,
                **{k: best[k] for k in choice},
                "latency_speedup": best["latency_speedup"],
                "latency_speedup_lo": lo,
                "latency_speedup_hi": hi,
                "n_prompts": best["n_prompts"],
                "verdict": verdict,
                "deploy": deploy_label(best.get("gamma", 0), lo, hi),
                "model_gamma": gopt,
                "model_speedup": sopt,
            }
        )
    return pd.DataFrame(
        out,
        columns=by
        + choice
        + [
            "latency_speedup",
            "latency_speedup_lo",
            "latency_speedup_hi",
            "n_prompts",
            "verdict",
            "deploy",
            "model_gamma",
            "model_speedup",
        ],
    )

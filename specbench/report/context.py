"""How C_t(k), C_d, α and the optimal γ move with context length: measured per context level
beside the cost model's context variant (`specbench.analysis.timing.ContextTerms`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specbench.analysis.acceptance import AcceptanceProfile, fit_alpha
from specbench.analysis.rows import ar_rows, iter_groups, match_rows, round_level, setting_keys, setting_rows, spec_rows
from specbench.analysis.speedup import latency_speedup, optimal_gamma
from specbench.analysis.summary import format_ci
from specbench.analysis.timing import TimingProfile
from specbench.analysis.validation import request_terms

CONTEXT = "context"  # the column this module adds: a job's context level in tokens


def context_levels(requests: pd.DataFrame) -> pd.Series | None:
    """Each job's context level (tokens): its requests' `context_tokens` if recorded, else their median
    `prompt_tokens` (a context sweep pads every prompt of a job to one length). None without job ids."""
    col = next((c for c in ("context_tokens", "prompt_tokens") if c in requests.columns), None)
    if col is None or "job" not in requests.columns:
        return None
    return requests.groupby("job")[col].median().round()


def with_context(df: pd.DataFrame, levels: pd.Series) -> pd.DataFrame:
    """df with the CONTEXT column (its job's level)."""
    return df.assign(**{CONTEXT: df["job"].map(levels)})


def varies_context(requests: pd.DataFrame, keys: list[str]) -> bool:
    """Whether jobs of one setting and γ ran at two or more context levels (a context sweep)."""
    if CONTEXT not in requests.columns or "gamma" not in requests.columns:
        return False
    k = [c for c in keys if c in requests.columns] + ["gamma"]
    return bool(requests.groupby(k, dropna=False)[CONTEXT].nunique().max() >= 2)


def _median_ms(x) -> float:
    x = np.asarray(x, float)
    return float(np.median(x)) * 1e3 if len(x) else math.nan


def context_table(rounds: pd.DataFrame, requests: pd.DataFrame, ct=None, *, gamma_max: int = 16) -> pd.DataFrame:
    """Per setting and context level: measured α, C_d per token, C_t(1), C_t(γmax+1) and best γ (decode-basis
    latency speedup with CI) beside the context model's values (fitted on all levels, evaluated at the level's
    mean round context L). α has no context term in the model: its prediction is the pooled α.
    rounds/requests: as `add_gamma_setting` returns them, with the CONTEXT column. Empty if context does not vary."""
    keys = setting_keys(rounds, None)
    if not varies_context(requests, keys):
        return pd.DataFrame()
    meas = latency_speedup(requests, keys + [CONTEXT, "gamma"], basis="decode")
    out = []
    for kd, _ in iter_groups(spec_rows(rounds), keys):
        rows = setting_rows(rounds, kd)
        acc = AcceptanceProfile.from_rounds(rows)
        tim = TimingProfile.from_rounds(rows, ct, context=True)
        gmax = int(spec_rows(rows)["gamma"].max())
        for level, sub in rows.groupby(CONTEXT, sort=True):
            sp, ar = round_level(spec_rows(sub)), round_level(ar_rows(sub))
            if sp.empty:
                continue
            L = float(sp["context_len"].mean())
            a = fit_alpha(spec_rows(sub))
            m = meas[match_rows(meas, {**kd, CONTEXT: level})].dropna(subset=["latency_speedup"])
            best = m.loc[m["latency_speedup"].idxmax()] if len(m) else None
            # the level's own decode budget and draft prefill (which grows with the context)
            terms = request_terms(requests, {**kd, CONTEXT: level})
            g_opt, s_opt = optimal_gamma(acc, tim, gamma_max, context_len=L, **terms)
            out.append(
                {
                    **kd,
                    "context tokens": level,
                    "mean round context L": L,
                    "α measured": a.alpha,
                    "α 95% CI": f"[{a.lo:.3f}, {a.hi:.3f}]",
                    "α model (pooled)": acc.alpha,
                    "C_d/token ms measured": _median_ms(sp["t_draft"] / sp["gamma"]),
                    "C_d/token ms model": (tim.c_d(gmax, L) - tim.c_d(0, L)) / gmax * 1e3,
                    "C_t(1) ms measured": _median_ms(ar["t_verify"]),
                    "C_t(1) ms model": tim.c_t(1, L) * 1e3,
                    f"C_t({gmax + 1}) ms measured": _median_ms(sp.loc[sp["gamma"] == gmax, "t_verify"]),
                    f"C_t({gmax + 1}) ms model": tim.c_t(gmax + 1, L) * 1e3,
                    "best γ measured": int(best["gamma"]) if best is not None else math.nan,
                    "its decode speedup [95% CI]": "–"
                    if best is None
                    else format_ci(
                        best["latency_speedup"],
                        best["latency_speedup_lo"],
                        best["latency_speedup_hi"],
                        best["n_prompts"],
                    ),
                    "γ* model": g_opt,
                    "model S(γ*)": s_opt,
                }
            )
    return pd.DataFrame(out)

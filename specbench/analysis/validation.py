"""Validation of the speedup model against the measured decode-phase latency speedup:
in-sample per γ (`speedup_vs_model`) and leave-one-γ-out (`leave_one_out`), with the
simple and the context-length timing models compared out of sample."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench.analysis.acceptance import AcceptanceProfile
from specbench.analysis.rows import (
    SETTING_KEYS,
    add_gamma_setting,
    iter_groups,
    match_rows,
    plain_mask,
    round_level,
    setting_keys,
    setting_rows,
    spec_rows,
)
from specbench.analysis.speedup import latency_speedup, optimal_gamma, predict_speedup
from specbench.analysis.timing import TimingProfile

_MEASURED = ["latency_speedup", "latency_speedup_lo", "latency_speedup_hi", "n_prompts"]


def fit_setting_profiles(
    rounds: pd.DataFrame, ct: pd.DataFrame | None = None, by=None, *, context: bool = False
) -> list[tuple[dict, AcceptanceProfile, TimingProfile]]:
    """(setting keys, acceptance profile, timing profile) per setting (SETTING_KEYS present,
    or `by` plus any varying timing key), each fitted on all the setting's rows and the
    AR rows that share its timing keys."""
    out = []
    for kd, _ in iter_groups(spec_rows(rounds), setting_keys(rounds, by)):
        rows = setting_rows(rounds, kd)
        out.append((kd, AcceptanceProfile.from_rounds(rows), TimingProfile.from_rounds(rows, ct, context=context)))
    return out


def _speculative_requests(requests: pd.DataFrame, keys: dict) -> pd.DataFrame:
    return requests[~plain_mask(requests) & match_rows(requests, keys)]


def decode_budget(requests: pd.DataFrame, keys: dict) -> int | None:
    """Median tokens decoded after the first (new_tokens − 1) by the speculative requests
    matching `keys`: the budget the model truncates each request's last round at (None: no requests)."""
    n = _speculative_requests(requests, keys)["new_tokens"].to_numpy(float) - 1
    n = n[n >= 1]
    return int(round(float(np.median(n)))) if len(n) else None


def draft_prefill_time(requests: pd.DataFrame, keys: dict) -> float:
    """Median seconds of the draft's prefill (`t_draft_prefill`) over the speculative requests matching
    `keys`: a cost of the decode phase that no round carries (0 when unrecorded: older rows, hf_assisted)."""
    if "t_draft_prefill" not in requests.columns:
        return 0.0
    t = _speculative_requests(requests, keys)["t_draft_prefill"].to_numpy(float)
    t = t[np.isfinite(t)]
    return float(np.median(t)) if len(t) else 0.0


def request_terms(requests: pd.DataFrame, keys: dict) -> dict:
    """What the speedup model takes from the measured requests of a selection, as
    `predict_speedup` / `optimal_gamma` keywords: `decode_tokens` and `draft_prefill`."""
    return {"decode_tokens": decode_budget(requests, keys), "draft_prefill": draft_prefill_time(requests, keys)}


def _measured(requests, keys, measured) -> pd.DataFrame:
    """The decode-basis latency speedup per setting and γ: `measured` if given (computed once per report)."""
    if measured is not None:
        return measured
    return latency_speedup(requests, keys + ["gamma"], basis="decode")


def speedup_vs_model(
    rounds: pd.DataFrame,
    requests: pd.DataFrame,
    ct: pd.DataFrame | None = None,
    by=None,
    *,
    gamma_max: int = 16,
    measured: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Measured decode-phase latency speedup (with CI and n) vs the truncation-aware model, per
    setting and γ setting. Profiles are fitted on all rows of the setting; `measured`: a
    precomputed `latency_speedup(requests, keys + ['gamma'], basis='decode')`.

    The draft's prefill (`draft_prefill_time`) is charged to the decode phase, as it is measured.
    Columns: keys + [gamma, latency_speedup, latency_speedup_lo, latency_speedup_hi, n_prompts,
    decode_tokens, predicted_speedup, predicted_single, ideal_speedup, rel_error, model_gamma,
    model_speedup] (rel_error = predicted/measured − 1; model_gamma = the model-optimal γ over
    1..gamma_max at the setting's decode budget).
    """
    rounds, requests = add_gamma_setting(rounds, requests)
    keys = setting_keys(rounds, by)
    meas = _measured(requests, keys, measured)
    out = []
    for kd, acc, tim in fit_setting_profiles(rounds, ct, keys):
        setting = request_terms(requests, kd)
        gopt, sopt = optimal_gamma(acc, tim, gamma_max, **setting)
        for _, r in meas[match_rows(meas, kd)].iterrows():
            g = int(r["gamma"])
            # each γ job's own decode budget; the draft's prefill, which no γ changes, from all of them
            terms = {**setting, "decode_tokens": decode_budget(requests, {**kd, "gamma": g})}
            p = predict_speedup(acc, tim, [g], **terms).iloc[0]
            ps = predict_speedup(acc, tim, [g], model="single", **terms).iloc[0]
            out.append(
                {
                    **kd,
                    "gamma": g,
                    **{c: r[c] for c in _MEASURED},
                    "decode_tokens": terms["decode_tokens"],
                    "predicted_speedup": p["predicted_speedup"],
                    "predicted_single": ps["predicted_speedup"],
                    "ideal_speedup": p["ideal_speedup"],
                    "rel_error": p["predicted_speedup"] / r["latency_speedup"] - 1,
                    "model_gamma": gopt,
                    "model_speedup": sopt,
                }
            )
    cols = keys + [
        "gamma",
        *_MEASURED,
        "decode_tokens",
        "predicted_speedup",
        "predicted_single",
        "ideal_speedup",
        "rel_error",
        "model_gamma",
        "model_speedup",
    ]
    return pd.DataFrame(out, columns=cols)


def leave_one_out(
    rounds: pd.DataFrame,
    requests: pd.DataFrame,
    ct: pd.DataFrame | None = None,
    by=None,
    *,
    model: str = "positional",
    context: bool = False,
    measured: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Leave-one-γ-out validation of the speedup model.

    For each setting and each γ setting, fit α (per position; positions beyond the other
    γ's largest are extrapolated with their single-α fit) and the timings (C_d, C_o, C_t1,
    C_t(k)) on the OTHER γ jobs only: their round rows, their AR rows and the `ct`
    micro-benchmark rows of every job but the held-out ones (a `ct` without a `job` column is
    a shared table and used in full). Predict γ at its decode budget and compare with its
    measured decode-phase latency speedup. context=True uses the context-length variant,
    evaluated at the held-out job's mean round context length (known before running it).
    Columns: keys + [gamma, latency_speedup, latency_speedup_lo, latency_speedup_hi,
    n_prompts, predicted_speedup, rel_error, context_len, model].
    """
    rounds, requests = add_gamma_setting(rounds, requests)
    keys = setting_keys(rounds, by)
    meas = _measured(requests, keys, measured)
    out = []
    for kd, sub in iter_groups(spec_rows(rounds), keys):
        rows = setting_rows(rounds, kd)
        gammas = sorted(int(g) for g in sub["gamma_setting"].dropna().unique())
        if len(gammas) < 2:
            continue
        for g in gammas:
            train = rows[rows["gamma_setting"] != g]
            held = sub[sub["gamma_setting"] == g]
            m = meas[match_rows(meas, {**kd, "gamma": g})]
            if spec_rows(train).empty or m.empty:
                continue
            ct_train = ct
            if ct is not None and "job" in ct.columns and "job" in held.columns:
                ct_train = ct[~ct["job"].isin(rows.loc[rows["gamma_setting"] == g, "job"].unique())]
            acc = AcceptanceProfile.from_rounds(train)
            tim = TimingProfile.from_rounds(train, ct_train, context=context)
            L = float(round_level(held)["context_len"].mean()) if context else None
            budget = decode_budget(requests, {**kd, "gamma": g})
            # The draft's prefill does not depend on γ: taken from the other γ jobs' requests.
            trained = requests[~match_rows(requests, {"gamma": g})] if "gamma" in requests.columns else requests
            prefill = draft_prefill_time(trained, kd)
            p = predict_speedup(
                acc, tim, [g], model=model, context_len=L, decode_tokens=budget, draft_prefill=prefill
            ).iloc[0]
            r = m.iloc[0]
            out.append(
                {
                    **kd,
                    "gamma": g,
                    **{c: r[c] for c in _MEASURED},
                    "predicted_speedup": p["predicted_speedup"],
                    "rel_error": p["predicted_speedup"] / r["latency_speedup"] - 1,
                    "context_len": L,
                    "model": "context" if context else "simple",
                }
            )
    cols = keys + ["gamma", *_MEASURED, "predicted_speedup", "rel_error", "context_len", "model"]
    return pd.DataFrame(out, columns=cols)


def loo_summary(loo: pd.DataFrame) -> pd.DataFrame:
    """Median and max |relative error| of a `leave_one_out` frame, per setting and model."""
    keys = [c for c in loo.columns if c in (*SETTING_KEYS, "model")]
    out = []
    for kd, sub in iter_groups(loo, keys):
        e = sub["rel_error"].abs()
        out.append(
            {**kd, "median_abs_rel_error": float(e.median()), "max_abs_rel_error": float(e.max()), "n_gammas": len(sub)}
        )
    return pd.DataFrame(out, columns=keys + ["median_abs_rel_error", "max_abs_rel_error", "n_gammas"])


def compare_context_model(
    rounds, requests, ct=None, by=None, *, simple: pd.DataFrame | None = None, **kw
) -> pd.DataFrame:
    """LOO error of the simple vs the context-length model, per setting.

    `simple`: an already computed `leave_one_out(..., context=False)` frame (saves its
    recomputation); `kw` go to `leave_one_out`. Columns: keys + [simple_median, simple_max,
    context_median, context_max, context_reduces_error] (errors are |relative errors|).
    """
    if simple is None:
        simple = leave_one_out(rounds, requests, ct, by, context=False, **kw)
    s = loo_summary(simple)
    c = loo_summary(leave_one_out(rounds, requests, ct, by, context=True, **kw))
    keys = [k for k in s.columns if k in SETTING_KEYS]
    s = s.drop(columns=["model", "n_gammas"]).rename(
        columns={"median_abs_rel_error": "simple_median", "max_abs_rel_error": "simple_max"}
    )
    c = c.drop(columns=["model"]).rename(
        columns={"median_abs_rel_error": "context_median", "max_abs_rel_error": "context_max"}
    )
    m = s.merge(c, on=keys, how="outer") if keys else pd.concat([s, c], axis=1)
    m["context_reduces_error"] = m["context_median"] < m["simple_median"]
    return m

"""Timing: the component costs C_d(γ), C_t(k), C_o(γ), C_t1 of one timing setting
(`TimingProfile`), with an optional context-length extension (`ContextTerms`).

Times are per round (shared by a round's batch rows): fits use one observation per round
and, where at least 3 exist, only full-batch rounds. Seconds everywhere.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.analysis.jsonio import JsonFile
from specbench.analysis.rows import (
    AR_IGNORE,
    TIMING_KEYS,
    ar_rows,
    full_batch,
    group_keys,
    iter_groups,
    match_rows,
    native,
    round_level,
    spec_rows,
)
from specbench.decoding.records import LLAMA_CT_COLUMNS
from specbench.engines import has_timed_rounds
from specbench.analysis.stats import eval_monotone_curve, fit_monotone_curve, linear_fit, robust_lstsq, within_slope

# Columns of a C_t(k) micro-benchmark row that select the timing setting it belongs to.
CT_KEYS = ("hardware", "dtype", "forward", "target", "batch_size")
LLAMA_CT_KEYS = ("hardware", "dtype", "target", "draft")  # what llama-bench rows are specific to (B = 1 only)


@dataclass
class ContextTerms:
    """Context-length extension of the timing model (L = context length in tokens).

    C_t(k, L) = curve_k(k) + ct_slope·L, C_d(γ, L) = cd_intercept + γ·(cd_per_token +
    cd_per_token_ctx·L), C_t1(L) = ct1_intercept + ct1_slope·L; C_o as in the simple model.
    `ct_k`/`ct_t` is the monotone C_t curve at L = 0 (context-adjusted points).
    """

    ct_slope: float
    ct_k: list[int]
    ct_t: list[float]
    cd_intercept: float
    cd_per_token: float
    cd_per_token_ctx: float
    ct1_intercept: float
    ct1_slope: float


@dataclass
class TimingProfile(JsonFile):
    """Component costs (seconds) of one (hardware, dtype, target, draft, batch_size).

    C_d(γ) = cd_intercept + cd_per_token·γ (least squares through the per-γ medians of
    per-round t_draft, weighted by rounds; through the origin if only one γ was run);
    C_t(k): monotone curve through (ct_k, ct_t), see `eval_monotone_curve`;
    C_o(γ): per-γ median t_overhead where measured, else co_intercept + co_per_token·γ;
    C_t1: median t_round / committed of AR rows. `context` holds the optional
    context-length variant (used when a context_len is passed to the methods).
    """

    cd_intercept: float
    cd_per_token: float
    ct_k: list[int]
    ct_t: list[float]
    co_by_gamma: dict[int, float]
    co_intercept: float
    co_per_token: float
    ct1: float
    ct_source: str = "ct"  # "ct" (micro-benchmark table) | "rounds" (t_verify fallback)
    keys: dict = field(default_factory=dict)
    n_rounds: int = 0
    context: ContextTerms | None = None

    # -- evaluation
    def c_d(self, gamma, context_len=None):
        g = np.asarray(gamma, float)
        if context_len is not None and self.context is not None:
            c = self.context
            v = c.cd_intercept + g * (c.cd_per_token + c.cd_per_token_ctx * float(context_len))
        else:
            v = self.cd_intercept + self.cd_per_token * g
        v = np.maximum(v, 0.0)
        return float(v) if v.ndim == 0 else v

    def c_t(self, k, context_len=None):
        if context_len is not None and self.context is not None:
            c = self.context
            v = np.asarray(eval_monotone_curve(c.ct_k, c.ct_t, k)) + c.ct_slope * float(context_len)
        else:
            v = np.asarray(eval_monotone_curve(self.ct_k, self.ct_t, k))
        return float(v) if v.ndim == 0 else v

    def c_o(self, gamma):
        def one(g):
            g = int(g)
            if g in self.co_by_gamma:
                return float(self.co_by_gamma[g])
            return max(0.0, self.co_intercept + self.co_per_token * g)

        if np.ndim(gamma) == 0:
            return one(gamma)
        return np.array([one(g) for g in np.asarray(gamma).ravel()]).reshape(np.shape(gamma))

    def c_t1(self, context_len=None) -> float:
        if context_len is not None and self.context is not None:
            return float(self.context.ct1_intercept + self.context.ct1_slope * float(context_len))
        return float(self.ct1)

    # -- fitting
    @classmethod
    def from_rounds(
        cls, rounds: pd.DataFrame, ct: pd.DataFrame | None = None, *, context: bool = True
    ) -> TimingProfile:
        """Fit from the round rows of ONE timing setting (speculative + AR rows).

        C_t(k) comes from the `ct` micro-benchmark rows matching the setting's hardware,
        dtype, target and batch_size (median per k over its context lengths); if there are
        none, from the rounds themselves: speculative t_verify at k = γ+1 plus AR
        t_verify at k = 1. Raises ValueError if the rows mix several timing settings.
        """
        sp = spec_rows(rounds)
        ar = ar_rows(rounds)
        keys: dict = {}
        for k in TIMING_KEYS:
            src = sp if k in ("draft", "decoder") else pd.concat([sp, ar])
            if k not in src.columns:
                continue
            vals = src[k].dropna().unique()
            if len(vals) > 1:
                raise ValueError(
                    f"rounds mix several timing settings: {k} in {sorted(map(str, vals))}; "
                    f"filter them or use fit_timing_profiles(), which groups by {TIMING_KEYS}"
                )
            if len(vals) == 1:
                keys[k] = native(vals[0])
        if "decoder" in keys and not has_timed_rounds(keys["decoder"]):  # llama.cpp: its llama-bench rows instead
            return cls.from_llama_bench(ct, keys, n_rounds=len(round_level(sp)))
        rs = full_batch(round_level(sp)) if len(sp) else round_level(sp)
        ra = full_batch(round_level(ar)) if len(ar) else round_level(ar)

        # Lines through the per-γ medians (weighted by rounds): robust to stalls (GC,
        # contention) that would drag a least-squares fit on raw rounds.
        cd_med = rs.groupby("gamma")["t_draft"].agg(["median", "size"]) if len(rs) else None
        cd_i, cd_s = (
            linear_fit(cd_med.index, cd_med["median"], "origin", cd_med["size"]) if len(rs) else (math.nan, math.nan)
        )
        co_agg = rs.groupby("gamma")["t_overhead"].agg(["median", "size"]) if len(rs) else None
        co_med = co_agg["median"] if len(rs) else pd.Series(dtype=float)
        co_i, co_s = (
            linear_fit(co_agg.index, co_agg["median"], "constant", co_agg["size"]) if len(rs) else (math.nan, math.nan)
        )
        arr = ar[ar["committed"] > 0] if len(ar) else ar
        if len(arr) and "batch_size" in arr.columns:
            full = arr[arr["n_active"] >= arr["batch_size"]]
            arr = full if len(full) >= 3 else arr
        ct1 = float((arr["t_round"] / arr["committed"]).median()) if len(arr) else math.nan

        pts = _ct_points(ct, keys)
        source = "ct"
        if pts.empty:
            source = "rounds"
            pts = pd.concat(
                [
                    pd.DataFrame(
                        {
                            "k": rs["gamma"].to_numpy(int) + 1,
                            "t": rs["t_verify"].to_numpy(float),
                            "context_len": rs["context_len"].to_numpy(float),
                        }
                    ),
                    pd.DataFrame(
                        {
                            "k": np.ones(len(ra), int),
                            "t": ra["t_verify"].to_numpy(float),
                            "context_len": ra["context_len"].to_numpy(float),
                        }
                    ),
                ],
                ignore_index=True,
            )
        ks, ts = fit_monotone_curve(pts["k"], pts["t"])

        ctx = None
        if context:
            ctx = _fit_context_terms(rs, ra, pts, (cd_i, cd_s), ct1)
        return cls(
            cd_intercept=cd_i,
            cd_per_token=cd_s,
            ct_k=ks,
            ct_t=ts,
            co_by_gamma={int(g): float(v) for g, v in co_med.items()},
            co_intercept=co_i,
            co_per_token=co_s,
            ct1=ct1,
            ct_source=source,
            keys=keys,
            n_rounds=int(len(rs) + len(ra)),
            context=ctx,
        )

    @classmethod
    def from_llama_bench(cls, ct: pd.DataFrame | None, keys: dict, n_rounds: int = 0) -> TimingProfile:
        """llama.cpp's costs from its `llama-bench` rows (`llama_ct` tables, `specbench.llama_cpp.costs`;
        matched on LLAMA_CT_KEYS): C_t(k) = median seconds of `pp k` at the prompts' depth; C_t1 = the
        target's `tg` seconds per token; C_d(γ) = γ draft `tg` steps + the draft's `pp γ+1`, since
        llama-server drops the draft's cache of its drafted tokens and re-evaluates the committed ones
        as a batch next round (line through γ = 1..15; 0 for n-gram lookup: no model). C_o = 0:
        llama.cpp does not time its rounds, so what the model still leaves out (sampling, checkpoints,
        the HTTP stream) is the gap to the measured speedup."""
        rows = ct if ct is not None and "role" in ct.columns else pd.DataFrame(columns=LLAMA_CT_COLUMNS)
        rows = rows[match_rows(rows, {k: v for k, v in keys.items() if k in LLAMA_CT_KEYS}) & rows["role"].notna()]
        target, draft = rows[rows["role"] == "target"], rows[rows["role"] == "draft"]

        def per_token(r: pd.DataFrame) -> float:
            tg = r[(r["n_gen"] > 0) & (r["n_prompt"] == 0)]
            return float((tg["seconds"] / tg["n_gen"]).median()) if len(tg) else math.nan

        def pp_median(r: pd.DataFrame) -> pd.Series:
            return r[(r["n_prompt"] > 0) & (r["n_gen"] == 0)].groupby("n_prompt")["seconds"].median()

        med, tg_d, catch_up = pp_median(target), per_token(draft), pp_median(draft)
        ks, ts = fit_monotone_curve(med.index.to_numpy(int), med.to_numpy(float)) if len(med) else ([], [])
        gammas = catch_up.index.to_numpy(int)[:-1]  # γ with a pp(γ+1) row
        cd_i, cd_s = (0.0, tg_d)
        if len(gammas):
            cd_i, cd_s = linear_fit(gammas, gammas * tg_d + catch_up.loc[gammas + 1].to_numpy(float))
        if len(target) and not len(draft) and not str(keys.get("draft", "")).startswith("gguf:"):
            cd_i, cd_s = 0.0, 0.0  # an n-gram lookup runs no draft model
        return cls(
            cd_intercept=cd_i,
            cd_per_token=cd_s,
            ct_k=ks,
            ct_t=ts,
            co_by_gamma={},
            co_intercept=0.0,
            co_per_token=0.0,
            ct1=per_token(target),
            ct_source="llama-bench",
            keys=keys,
            n_rounds=n_rounds,
        )

    # -- serialisation
    def to_dict(self) -> dict:
        d = asdict(self)
        d["co_by_gamma"] = {str(k): v for k, v in self.co_by_gamma.items()}
        d = json.loads(json.dumps(d, default=native).replace("NaN", "null"))
        return {"kind": "TimingProfile", "version": 1, **d}

    @classmethod
    def from_dict(cls, d: dict) -> TimingProfile:
        d = {k: v for k, v in d.items() if k not in ("kind", "version")}
        nan = lambda v: math.nan if v is None else v  # noqa: E731
        for k in ("cd_intercept", "cd_per_token", "co_intercept", "co_per_token", "ct1"):
            d[k] = nan(d[k])
        d["co_by_gamma"] = {int(k): float(v) for k, v in d["co_by_gamma"].items()}
        d["ct_t"] = [nan(v) for v in d["ct_t"]]
        if d.get("context") is not None:
            c = {k: (nan(v) if not isinstance(v, list) else [nan(x) for x in v]) for k, v in d["context"].items()}
            d["context"] = ContextTerms(**c)
        return cls(**d)


def _ct_points(ct: pd.DataFrame | None, keys: dict) -> pd.DataFrame:
    """Rows of the C_t micro-benchmark table that match a timing setting: k, t, context_len."""
    if ct is None or len(ct) == 0:
        return pd.DataFrame(columns=["k", "t", "context_len"])
    m = match_rows(ct, {k: v for k, v in keys.items() if k in CT_KEYS})
    sub = ct[m]
    return pd.DataFrame(
        {
            "k": sub["k"].to_numpy(int),
            "t": sub["t_forward"].to_numpy(float),
            "context_len": sub["context_len"].to_numpy(float) if "context_len" in sub.columns else np.nan,
        }
    )


def _fit_context_terms(rs, ra, pts, cd_simple, ct1) -> ContextTerms:
    # C_t: one slope per context token, estimated within k (fixed effects), from the
    # chosen C_t points if their context varies within k, else from the rounds.
    beta = within_slope(pts["k"], pts["context_len"], pts["t"]) if pts["context_len"].notna().all() else 0.0
    if beta == 0.0:
        rp = pd.concat(
            [
                pd.DataFrame({"k": rs["gamma"].to_numpy(int) + 1, "L": rs["context_len"], "t": rs["t_verify"]}),
                pd.DataFrame({"k": np.ones(len(ra), int), "L": ra["context_len"], "t": ra["t_verify"]}),
            ],
            ignore_index=True,
        )
        beta = within_slope(rp["k"], rp["L"], rp["t"])
    L = pts["context_len"].fillna(0.0).to_numpy(float)
    ks, ts = fit_monotone_curve(pts["k"], pts["t"].to_numpy(float) - beta * L)
    # C_d: t_draft = a + γ·(b + c·L)
    a, b, c = cd_simple[0], cd_simple[1], 0.0
    if len(rs) >= 3:
        g = rs["gamma"].to_numpy(float)
        X = np.column_stack([np.ones(len(rs)), g, g * rs["context_len"].to_numpy(float)])
        if np.linalg.matrix_rank(X) == 3:
            a, b, c = (float(v) for v in robust_lstsq(X, rs["t_draft"].to_numpy(float)))
    # C_t1(L): AR time per round (one token per row) vs context
    if len(ra) >= 2 and ra["context_len"].nunique() >= 2:
        L1 = ra["context_len"].to_numpy(float)
        t1 = (ra["t_round"] / (ra["committed"] / ra["rows"])).to_numpy(float)
        i1, s1 = robust_lstsq(np.column_stack([np.ones_like(L1), L1]), t1)
    else:
        i1, s1 = ct1, 0.0
    return ContextTerms(
        ct_slope=float(beta),
        ct_k=ks,
        ct_t=ts,
        cd_intercept=a,
        cd_per_token=b,
        cd_per_token_ctx=c,
        ct1_intercept=float(i1),
        ct1_slope=float(s1),
    )


def fit_timing_profiles(rounds: pd.DataFrame, ct: pd.DataFrame | None = None, by=None, *, context: bool = True) -> dict:
    """TimingProfile per timing setting: {key tuple: profile}, keys = TIMING_KEYS present
    (or `by`). AR rows are matched to a setting ignoring draft/decoder."""
    sp = spec_rows(rounds)
    ar = ar_rows(rounds)
    keys = group_keys(sp, by, TIMING_KEYS)
    out = {}
    for kd, sub in iter_groups(sp, keys):
        rows = pd.concat([sub, ar[match_rows(ar, kd, ignore=AR_IGNORE)]])
        out[tuple(kd.get(k) for k in keys)] = TimingProfile.from_rounds(rows, ct, context=context)
    return out


def timing_table(rounds: pd.DataFrame, ct: pd.DataFrame | None = None, by=None) -> pd.DataFrame:
    """One row per timing setting: the fitted component costs (seconds) and the C_t source."""
    keys = group_keys(spec_rows(rounds), by, TIMING_KEYS)
    rows = []
    for kt, prof in fit_timing_profiles(rounds, ct, by=keys).items():
        rows.append(
            {
                **dict(zip(keys, kt)),
                "cd_intercept": prof.cd_intercept,
                "cd_per_token": prof.cd_per_token,
                "co_intercept": prof.co_intercept,
                "co_per_token": prof.co_per_token,
                "ct1": prof.ct1,
                "ct_1": prof.c_t(1),
                "ct_max_k": max(prof.ct_k) if prof.ct_k else math.nan,
                "ct_source": prof.ct_source,
                "n_rounds": prof.n_rounds,
            }
        )
    return pd.DataFrame(rows)

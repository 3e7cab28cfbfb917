"""Cost model of speculative decoding, fitted from raw rows (see DESIGN.md).

Everything here is a pure function of DataFrames in the raw schema of
`specbench.decoding.records` (plus the job keys that `specbench.runstore.load_sweep` adds),
or a small dataclass built from them. Nothing reads clocks, models or files except
the explicit `to_json` / `from_json` of the profiles.

Conventions
-----------
* **Rows.** "Speculative rows" are round rows of any non-autoregressive decoder with
  ``gamma > 0``; "AR rows" are rows of ``decoder == "autoregressive"``.
* **γ of a row vs γ of a job.** Acceptance and E[N] are keyed by the *row's* ``gamma``
  (tokens actually drafted that round). Speedups are per *job*; a job's γ setting
  (``gamma_setting`` on round rows, ``gamma`` on request rows, see
  :func:`add_gamma_setting`) is the largest γ its speculative rows drafted. The AR rows
  of a job (its paired baseline) carry the same setting.
* **Acceptance.** α_i = P(accepted ≥ i | accepted ≥ i−1), counted over the rows that
  drafted position i (``gamma ≥ i``). The accept length of a round is ``accepted + 1``
  and *not* ``committed``: ``committed`` is truncated at EOS / max_new_tokens, which is
  a property of the request, not of the draft; using it would bias E[N] down at large γ.
* **Timings are per round.** The times of a round are shared by all its batch rows, so
  timing fits use one observation per round (:func:`round_level`) and, where at least 3
  exist, only full-batch rounds (``n_active == batch_size``) so that a batch size's
  timing is not diluted by the tail of a batch.
* **Units.** Seconds everywhere; speedups are ratios (×).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import optimize, stats

from specbench.decoding.records import AUTOREGRESSIVE, AUTOREGRESSIVE_STEP, BONUS, RECOVERED, SPECULATIVE

# Keys that identify what an acceptance profile depends on (not hardware or batch).
ACCEPTANCE_KEYS = ("target", "draft", "decoder", "workload", "sampling")
# Keys a timing profile is specific to.
TIMING_KEYS = ("hardware", "dtype", "target", "draft", "decoder", "batch_size")
# Keys of one "setting" for speedup comparisons (one acceptance x one timing profile).
SETTING_KEYS = ("target", "draft", "decoder", "workload", "sampling", "hardware", "dtype", "batch_size")
# Keys that do not select the AR baseline rows of a setting.
_AR_IGNORE = ("draft", "draft_kind", "decoder", "gamma", "gamma_setting")

_ROUND_ID = ("job", "decoder", "repeat", "batch", "round", "gamma", "t_draft", "t_verify", "t_overhead", "t_round")


# --------------------------------------------------------------------------- helpers


def _keys(df: pd.DataFrame, by: Iterable[str] | str | None, default: Sequence[str] = ()) -> list[str]:
    """Grouping keys: `by` as a list (validated), or the `default` keys present in df."""
    if by is None:
        return [k for k in default if k in df.columns]
    keys = [by] if isinstance(by, str) else list(by)
    missing = [k for k in keys if k not in df.columns]
    if missing:
        raise ValueError(f"grouping keys {missing} are not columns; available: {sorted(df.columns)}")
    return keys


def _iter_groups(df: pd.DataFrame, by: list[str]):
    if not by:
        yield {}, df
        return
    for key, sub in df.groupby(by, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        yield dict(zip(by, key)), sub


def _match(df: pd.DataFrame, keys: dict, ignore: Iterable[str] = ()) -> pd.Series:
    """Rows of df whose columns equal `keys` (NaN matches NaN); keys not in df are ignored."""
    mask = pd.Series(True, index=df.index)
    for k, v in keys.items():
        if k in ignore or k not in df.columns:
            continue
        if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
            mask &= df[k].isna()
        else:
            mask &= df[k] == v
    return mask


def _native(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        v = float(v)
    if isinstance(v, float) and math.isnan(v):
        return None
    if v is pd.NA:
        return None
    return v


def _decoder(df: pd.DataFrame) -> pd.Series:
    if "decoder" in df.columns:
        return df["decoder"].astype(object)
    return pd.Series(np.where(df["gamma"] > 0, SPECULATIVE, AUTOREGRESSIVE), index=df.index, dtype=object)


def spec_rows(rounds: pd.DataFrame) -> pd.DataFrame:
    """Round rows of speculative decoders (any decoder but autoregressive) with gamma > 0."""
    return rounds[(_decoder(rounds) != AUTOREGRESSIVE) & (rounds["gamma"] > 0)]


def ar_rows(rounds: pd.DataFrame) -> pd.DataFrame:
    """Round rows of the autoregressive baseline."""
    return rounds[_decoder(rounds) == AUTOREGRESSIVE]


def add_gamma_setting(rounds: pd.DataFrame, requests: pd.DataFrame | None = None):
    """Add each job's γ setting: `gamma_setting` on round rows, `gamma` on request rows.

    A job's setting is its `gamma_config` column where present (the runner's job key),
    else the largest `gamma` among its speculative rows (a decoder may draft fewer near
    max_new_tokens). The AR rows and requests of the job get the same value (the raw
    per-request `gamma`, 0 for AR, is replaced by the setting). Without either, a
    `gamma` column already on requests is kept. Returns (rounds, requests) copies
    (requests is None if not given).
    """
    rounds = rounds.copy()
    if "gamma_config" in rounds.columns and "gamma_setting" not in rounds.columns:
        rounds["gamma_setting"] = rounds["gamma_config"]
    if requests is not None and "gamma_config" in requests.columns:
        requests = requests.copy()
        requests["gamma"] = requests["gamma_config"]
    sp = spec_rows(rounds)
    if "job" in rounds.columns:
        by_job = sp.groupby("job")["gamma"].max()
        if "gamma_setting" not in rounds.columns:
            rounds["gamma_setting"] = rounds["job"].map(by_job)
    else:
        by_job = None
        if "gamma_setting" not in rounds.columns:
            rounds["gamma_setting"] = sp["gamma"].max() if len(sp) else np.nan
    if requests is not None:
        requests = requests.copy()
        if "gamma" not in requests.columns:
            if by_job is not None and "job" in requests.columns:
                requests["gamma"] = requests["job"].map(by_job)
            else:
                requests["gamma"] = sp["gamma"].max() if len(sp) else np.nan
    return rounds, requests


def round_level(rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per decoding round: times are shared by all batch rows of a round.

    A round is identified by (job, decoder, repeat, batch, round, gamma) and its times;
    `context_len` becomes the mean over its rows, `n_active` the max, `accepted` and
    `committed` the sums, `rows` the number of batch rows.
    """
    keys = [c for c in _ROUND_ID if c in rounds.columns]
    extra = [c for c in (*TIMING_KEYS, "workload", "sampling", "gamma_setting") if c in rounds.columns and c not in keys]
    if rounds.empty:
        return rounds.assign(rows=pd.Series(dtype=int))
    rid = rounds.groupby(keys, dropna=False, sort=False).ngroup().to_numpy()  # ids in order of appearance
    first = ~pd.Series(rid).duplicated().to_numpy()
    out = rounds.loc[first, keys + extra].reset_index(drop=True)
    n = len(out)
    rows = np.bincount(rid, minlength=n)
    out["context_len"] = np.bincount(rid, rounds["context_len"].to_numpy(float), n) / rows
    n_active = np.zeros(n, int)
    np.maximum.at(n_active, rid, rounds["n_active"].to_numpy(int))
    out["n_active"] = n_active
    out["accepted"] = np.bincount(rid, rounds["accepted"].to_numpy(float), n).astype(int)
    out["committed"] = np.bincount(rid, rounds["committed"].to_numpy(float), n).astype(int)
    out["rows"] = rows
    return out


def _full_batch(rl: pd.DataFrame, min_rounds: int = 3) -> pd.DataFrame:
    """Full-batch rounds (n_active == batch_size) if at least `min_rounds` exist, else all."""
    if "batch_size" in rl.columns and len(rl):
        m = rl["n_active"] >= rl["batch_size"]
        if m.sum() >= min_rounds:
            return rl[m]
    return rl


def proportion_ci(successes: int, trials: int, confidence: float = 0.95, method: str = "wilson") -> tuple[float, float]:
    """Binomial proportion CI (scipy binomtest): 'wilson' or 'exact' (Clopper-Pearson). NaN if trials == 0."""
    if trials <= 0:
        return (math.nan, math.nan)
    ci = stats.binomtest(int(successes), int(trials)).proportion_ci(confidence_level=confidence, method=method)
    return (float(ci.low), float(ci.high))


def bootstrap_median_ci(
    values, confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(median, lo, hi) with a percentile bootstrap CI (scipy.stats.bootstrap).

    n == 1 gives NaN bounds; identical values give lo == hi == the value.
    """
    x = np.asarray(values, float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return (math.nan, math.nan, math.nan)
    med = float(np.median(x))
    if len(x) < 2:
        return (med, math.nan, math.nan)
    if np.ptp(x) == 0:
        return (med, med, med)
    res = stats.bootstrap(
        (x,),
        np.median,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return (med, float(res.confidence_interval.low), float(res.confidence_interval.high))


# --------------------------------------------------------------------------- acceptance


def _check_acceptance(df: pd.DataFrame) -> None:
    bad = (df["accepted"] < 0) | (df["accepted"] > df["gamma"])
    if bad.any():
        raise ValueError(f"{int(bad.sum())} round rows have accepted outside [0, gamma]")


def position_counts(accepted, gamma) -> tuple[np.ndarray, np.ndarray]:
    """Per draft position i = 1..max(gamma): (trials_i, successes_i).

    trials_i = #rows with gamma ≥ i and accepted ≥ i−1 (position i was drafted and tested),
    successes_i = #rows with gamma ≥ i and accepted ≥ i. α_i = successes_i / trials_i.
    """
    a = np.asarray(accepted, int)
    g = np.asarray(gamma, int)
    gmax = int(g.max()) if len(g) else 0
    trials = np.zeros(gmax, int)
    succ = np.zeros(gmax, int)
    for i in range(1, gmax + 1):
        drafted = g >= i
        trials[i - 1] = int((drafted & (a >= i - 1)).sum())
        succ[i - 1] = int((drafted & (a >= i)).sum())
    return trials, succ


def acceptance_by_position(
    rounds: pd.DataFrame, by=None, confidence: float = 0.95, method: str = "wilson"
) -> pd.DataFrame:
    """Per-position acceptance α_i with a binomial CI, per group.

    Columns: by + [position, trials, successes, alpha, alpha_lo, alpha_hi]. `by` defaults
    to the ACCEPTANCE_KEYS present (any columns, e.g. "category" or "gamma", may be used).
    """
    sp = spec_rows(rounds)
    _check_acceptance(sp)
    keys = _keys(sp, by, ACCEPTANCE_KEYS)
    out = []
    for kd, sub in _iter_groups(sp, keys):
        trials, succ = position_counts(sub["accepted"], sub["gamma"])
        for i, (n, k) in enumerate(zip(trials, succ), start=1):
            lo, hi = proportion_ci(k, n, confidence, method)
            out.append({**kd, "position": i, "trials": int(n), "successes": int(k),
                        "alpha": k / n if n else math.nan, "alpha_lo": lo, "alpha_hi": hi})
    cols = keys + ["position", "trials", "successes", "alpha", "alpha_lo", "alpha_hi"]
    return pd.DataFrame(out, columns=cols)


@dataclass
class AlphaFit:
    """Single-α fit: α̂ = Σaccepted / Σ(accepted + [accepted < γ]) with a binomial CI."""

    alpha: float
    lo: float
    hi: float
    successes: int
    trials: int


def fit_alpha(rounds: pd.DataFrame, confidence: float = 0.95, method: str = "wilson") -> AlphaFit:
    """MLE of one α shared by all positions (a truncated geometric accept count).

    A round with γ drafted tokens has P(A = a) = α^a (1−α) for a < γ and α^γ for a = γ,
    so log L = Σ a·log α + Σ [a < γ]·log(1−α); setting d/dα = 0 gives
    α̂ = Σa / (Σa + Σ[a < γ]). It is the pooled Bernoulli rate of all tested positions
    (each round tests min(a+1, γ) positions and passes a of them), hence the binomial CI.
    """
    sp = spec_rows(rounds)
    _check_acceptance(sp)
    a = sp["accepted"].to_numpy(int)
    g = sp["gamma"].to_numpy(int)
    k = int(a.sum())
    n = int(k + (a < g).sum())
    lo, hi = proportion_ci(k, n, confidence, method)
    return AlphaFit(alpha=k / n if n else math.nan, lo=lo, hi=hi, successes=k, trials=n)


def expected_accept_length(alpha, gamma):
    """E[N] with one α: (1 − α^{γ+1}) / (1 − α); exactly γ+1 at α = 1, 1 at α = 0.

    Vectorised over alpha and gamma; returns a float for scalar input.
    """
    a = np.asarray(alpha, float)
    g = np.asarray(gamma)
    if np.any((a < 0) | (a > 1)):
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    if np.any(g < 0):
        raise ValueError(f"gamma must be >= 0, got {gamma!r}")
    a, g = np.broadcast_arrays(a, g.astype(int))
    out = np.empty(a.shape, float)
    near = np.abs(1.0 - a) < 1e-6  # closed form cancels near 1: sum the series there
    far = ~near
    out[far] = (1.0 - a[far] ** (g[far] + 1)) / (1.0 - a[far])
    for idx in zip(*np.nonzero(near)) if a.ndim else ([()] if near else []):
        out[idx] = float(sum(a[idx] ** j for j in range(int(g[idx]) + 1)))
    return float(out) if out.ndim == 0 else out


def expected_accept_length_positional(alphas: Sequence[float], gamma: int) -> float:
    """E[N] with per-position α: 1 + Σ_{i=1..γ} Π_{j≤i} α_j."""
    al = np.asarray(list(alphas)[:gamma], float)
    if len(al) < gamma:
        raise ValueError(f"need {gamma} per-position alphas, got {len(al)}")
    return float(1.0 + np.cumprod(al).sum())


def measured_accept_length(rounds: pd.DataFrame, by=None, confidence: float = 0.95) -> pd.DataFrame:
    """Measured E[N] = mean(accepted + 1) per group and row gamma, with a t-interval.

    Columns: by + [gamma, n_rounds, accept_length, accept_length_lo, accept_length_hi,
    mean_committed]. mean_committed (truncated at EOS/max_new_tokens) is shown for contrast.
    """
    sp = spec_rows(rounds)
    keys = _keys(sp, by, ACCEPTANCE_KEYS)
    keys = [k for k in keys if k != "gamma"]
    out = []
    for kd, sub in _iter_groups(sp, keys + ["gamma"]):
        n = len(sub)
        x = sub["accepted"].to_numpy(float) + 1.0
        m = float(x.mean())
        if n > 1 and x.std(ddof=1) > 0:
            h = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
        else:
            h = 0.0 if n > 1 else math.nan
        out.append({**kd, "gamma": int(kd["gamma"]), "n_rounds": n, "accept_length": m,
                    "accept_length_lo": m - h, "accept_length_hi": m + h,
                    "mean_committed": float(sub["committed"].mean())})
    cols = keys + ["gamma", "n_rounds", "accept_length", "accept_length_lo", "accept_length_hi", "mean_committed"]
    return pd.DataFrame(out, columns=cols)


def compare_accept_length_models(rounds: pd.DataFrame, by=None) -> pd.DataFrame:
    """Measured E[N] per row gamma vs the single-α and the per-position predictions.

    Both models are fitted on all rows of the group (all gammas pooled). Columns: by +
    measured_accept_length's + [pred_single, pred_positional, err_single, err_positional,
    better] (err = predicted − measured; better = the model with the smaller |err|).
    Note: fitted on a single γ, the per-position model reproduces the measured E[N]
    exactly; the comparison is informative when several γ are pooled (and in
    `leave_one_out`).
    """
    sp = spec_rows(rounds)
    keys = [k for k in _keys(sp, by, ACCEPTANCE_KEYS) if k != "gamma"]
    meas = measured_accept_length(sp, keys)
    rows = []
    for kd, sub in _iter_groups(sp, keys):
        prof = AcceptanceProfile.from_rounds(sub)
        m = meas[_match(meas, kd)]
        for _, r in m.iterrows():
            g = int(r["gamma"])
            ps = prof.accept_length(g, "single")
            pp = prof.accept_length(g, "positional")
            es, ep = ps - r["accept_length"], pp - r["accept_length"]
            rows.append({**r.to_dict(), "pred_single": ps, "pred_positional": pp, "err_single": es,
                         "err_positional": ep, "better": "positional" if abs(ep) <= abs(es) else "single"})
    cols = list(meas.columns) + ["pred_single", "pred_positional", "err_single", "err_positional", "better"]
    return pd.DataFrame(rows, columns=cols)


def which_accept_length_model(comparison: pd.DataFrame) -> pd.DataFrame:
    """Per group of a `compare_accept_length_models` frame: mean |error| of each model, better one."""
    keys = [c for c in comparison.columns if c in (*ACCEPTANCE_KEYS, "category")]
    out = []
    for kd, sub in _iter_groups(comparison, keys):
        ms, mp = float(sub["err_single"].abs().mean()), float(sub["err_positional"].abs().mean())
        out.append({**kd, "mae_single": ms, "mae_positional": mp, "n_gammas": len(sub),
                    "better": "positional" if mp <= ms else "single"})
    return pd.DataFrame(out, columns=keys + ["mae_single", "mae_positional", "n_gammas", "better"])


@dataclass
class AcceptanceProfile:
    """Per-position acceptance of one (target, draft, workload, sampling) setting.

    `alphas[i-1]` is α_i (NaN where position i was never tested); `alpha` is the
    single-α fit, used for positions beyond the measured ones (extrapolation).
    """

    alphas: list[float]
    trials: list[int]
    successes: list[int]
    alpha: float
    alpha_trials: int
    alpha_successes: int
    keys: dict = field(default_factory=dict)
    n_rounds: int = 0

    @classmethod
    def from_rounds(cls, rounds: pd.DataFrame, keys: dict | None = None) -> "AcceptanceProfile":
        sp = spec_rows(rounds)
        _check_acceptance(sp)
        trials, succ = position_counts(sp["accepted"], sp["gamma"])
        fit = fit_alpha(sp)
        if keys is None:
            keys = {}
            for k in ACCEPTANCE_KEYS:
                if k in sp.columns:
                    vals = sp[k].dropna().unique()
                    if len(vals) == 1:
                        keys[k] = _native(vals[0])
        return cls(
            alphas=[float(s / t) if t else math.nan for s, t in zip(succ, trials)],
            trials=[int(t) for t in trials],
            successes=[int(s) for s in succ],
            alpha=fit.alpha,
            alpha_trials=fit.trials,
            alpha_successes=fit.successes,
            keys={k: _native(v) for k, v in keys.items()},
            n_rounds=int(len(sp)),
        )

    def alpha_at(self, i: int) -> float:
        """α_i: measured if position i was tested, else the single-α fit."""
        if 1 <= i <= len(self.alphas) and self.trials[i - 1] > 0:
            return self.alphas[i - 1]
        return self.alpha

    def alpha_profile(self, gamma: int) -> list[float]:
        return [self.alpha_at(i) for i in range(1, gamma + 1)]

    def accept_length(self, gamma: int, model: str = "positional") -> float:
        """Predicted E[N] at γ: model 'positional' (α_i, extrapolated) or 'single' (α)."""
        if model == "single":
            return expected_accept_length(self.alpha, gamma) if not math.isnan(self.alpha) else math.nan
        if model == "positional":
            al = self.alpha_profile(gamma)
            return math.nan if any(math.isnan(a) for a in al) else expected_accept_length_positional(al, gamma)
        raise ValueError(f"model must be 'positional' or 'single', got {model!r}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["alphas"] = [_native(a) for a in self.alphas]
        d["alpha"] = _native(self.alpha)
        return {"kind": "AcceptanceProfile", "version": 1, **d}

    @classmethod
    def from_dict(cls, d: dict) -> "AcceptanceProfile":
        d = {k: v for k, v in d.items() if k not in ("kind", "version")}
        d["alphas"] = [math.nan if a is None else float(a) for a in d["alphas"]]
        d["alpha"] = math.nan if d["alpha"] is None else float(d["alpha"])
        return cls(**d)

    def to_json(self, path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2))
        return path

    @classmethod
    def from_json(cls, path) -> "AcceptanceProfile":
        return cls.from_dict(json.loads(Path(path).read_text()))


# --------------------------------------------------------------------------- timings


def isotonic_increasing(y, w=None) -> np.ndarray:
    """Least-squares non-decreasing fit of y (pool adjacent violators), weights w."""
    y = np.asarray(y, float)
    w = np.ones_like(y) if w is None else np.asarray(w, float)
    blocks: list[list[float]] = []  # [weighted sum, weight, count]
    for yi, wi in zip(y, w):
        blocks.append([yi * wi, wi, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, ww, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += ww
            blocks[-1][2] += c
    return np.concatenate([np.full(c, s / ww) for s, ww, c in blocks]) if blocks else np.array([])


def fit_monotone_curve(k, t) -> tuple[list[int], list[float]]:
    """C_t(k) points: median time per k, then a non-decreasing fit weighted by counts."""
    df = pd.DataFrame({"k": np.asarray(k, int), "t": np.asarray(t, float)}).dropna()
    if df.empty:
        return [], []
    g = df.groupby("k")["t"].agg(["median", "size"]).sort_index()
    fitted = isotonic_increasing(g["median"].to_numpy(), g["size"].to_numpy())
    return [int(x) for x in g.index], [float(x) for x in fitted]


def eval_monotone_curve(ks: Sequence[int], ts: Sequence[float], k):
    """Evaluate a monotone curve: linear interpolation inside, flat below the smallest k,
    linear extrapolation beyond the largest k, anchored at the last point, with the
    least-squares slope of the last (up to) 4 points (clipped at 0; flat if only one
    point). Returns a float for scalar k."""
    kk = np.asarray(k, float)
    if len(ks) == 0:
        out = np.full(kk.shape, math.nan)
    elif len(ks) == 1:
        out = np.full(kk.shape, float(ts[0]))
    else:
        xs, ys = np.asarray(ks, float), np.asarray(ts, float)
        out = np.interp(kk, xs, ys)
        tail = slice(-min(4, len(xs)), None)
        slope = max(0.0, float(np.polyfit(xs[tail], ys[tail], 1)[0]))
        hi = kk > xs[-1]
        out = np.where(hi, ys[-1] + slope * (kk - xs[-1]), out)
    return float(out) if np.ndim(out) == 0 else out


def _linear_fit(x, y, single: str = "origin", w=None) -> tuple[float, float]:
    """(intercept, slope) of y on x by (weighted) least squares. With one distinct x:
    through the origin (single='origin': slope = median(y)/x) or a constant
    (single='constant')."""
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    if len(x) == 0:
        return (math.nan, math.nan)
    if len(np.unique(x)) >= 2:
        if w is None:
            r = stats.linregress(x, y)
            return (float(r.intercept), float(r.slope))
        sw = np.sqrt(np.asarray(w, float))
        coef = np.linalg.lstsq(np.column_stack([np.ones_like(x), x]) * sw[:, None], y * sw, rcond=None)[0]
        return (float(coef[0]), float(coef[1]))
    if single == "origin" and x[0] != 0:
        return (0.0, float(np.median(y) / x[0]))
    return (float(np.median(y)), 0.0)


def _robust_lstsq(X, y) -> np.ndarray:
    """Linear least squares with a soft-L1 loss (scale: 1.4826·MAD of the OLS residuals),
    so that a few stalled rounds do not drive the fit; plain OLS if residuals are exact."""
    X = np.asarray(X, float)
    y = np.asarray(y, float)
    beta0 = np.linalg.lstsq(X, y, rcond=None)[0]
    res = y - X @ beta0
    scale = 1.4826 * float(np.median(np.abs(res - np.median(res))))
    if not np.isfinite(scale) or scale <= 1e-15:
        return beta0
    fit = optimize.least_squares(lambda b: X @ b - y, beta0, loss="soft_l1", f_scale=scale)
    return fit.x


def _within_slope(group, x, y) -> float:
    """Slope of y on x within groups (fixed effects: x and y centred per group), robust
    fit; 0 if x does not vary within groups."""
    df = pd.DataFrame({"g": np.asarray(group), "x": np.asarray(x, float), "y": np.asarray(y, float)}).dropna()
    if df.empty:
        return 0.0
    dx = (df["x"] - df.groupby("g")["x"].transform("mean")).to_numpy()
    dy = (df["y"] - df.groupby("g")["y"].transform("mean")).to_numpy()
    if float((dx * dx).sum()) <= 1e-12:
        return 0.0
    return float(_robust_lstsq(dx[:, None], dy)[0])


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
class TimingProfile:
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
    def from_rounds(cls, rounds: pd.DataFrame, ct: pd.DataFrame | None = None, *, context: bool = True) -> "TimingProfile":
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
                keys[k] = _native(vals[0])
        rs = _full_batch(round_level(sp)) if len(sp) else round_level(sp)
        ra = _full_batch(round_level(ar)) if len(ar) else round_level(ar)

        # Lines through the per-γ medians (weighted by rounds): robust to stalls (GC,
        # contention) that would drag a least-squares fit on raw rounds.
        cd_med = rs.groupby("gamma")["t_draft"].agg(["median", "size"]) if len(rs) else None
        cd_i, cd_s = _linear_fit(cd_med.index, cd_med["median"], "origin", cd_med["size"]) if len(rs) \
            else (math.nan, math.nan)
        co_agg = rs.groupby("gamma")["t_overhead"].agg(["median", "size"]) if len(rs) else None
        co_med = co_agg["median"] if len(rs) else pd.Series(dtype=float)
        co_i, co_s = _linear_fit(co_agg.index, co_agg["median"], "constant", co_agg["size"]) if len(rs) \
            else (math.nan, math.nan)
        arr = ar[ar["committed"] > 0] if len(ar) else ar
        if len(arr) and "batch_size" in arr.columns:
            full = arr[arr["n_active"] >= arr["batch_size"]]
            arr = full if len(full) >= 3 else arr
        ct1 = float((arr["t_round"] / arr["committed"]).median()) if len(arr) else math.nan

        pts = _ct_points(ct, keys)
        source = "ct"
        if pts.empty:
            source = "rounds"
            pts = pd.concat([
                pd.DataFrame({"k": rs["gamma"].to_numpy(int) + 1, "t": rs["t_verify"].to_numpy(float),
                              "context_len": rs["context_len"].to_numpy(float)}),
                pd.DataFrame({"k": np.ones(len(ra), int), "t": ra["t_verify"].to_numpy(float),
                              "context_len": ra["context_len"].to_numpy(float)}),
            ], ignore_index=True)
        ks, ts = fit_monotone_curve(pts["k"], pts["t"])

        ctx = None
        if context:
            ctx = _fit_context_terms(rs, ra, pts, (cd_i, cd_s), ct1)
        return cls(
            cd_intercept=cd_i, cd_per_token=cd_s, ct_k=ks, ct_t=ts,
            co_by_gamma={int(g): float(v) for g, v in co_med.items()},
            co_intercept=co_i, co_per_token=co_s, ct1=ct1, ct_source=source,
            keys=keys, n_rounds=int(len(rs) + len(ra)), context=ctx,
        )

    # -- serialisation
    def to_dict(self) -> dict:
        d = asdict(self)
        d["co_by_gamma"] = {str(k): v for k, v in self.co_by_gamma.items()}
        d = json.loads(json.dumps(d, default=_native).replace("NaN", "null"))
        return {"kind": "TimingProfile", "version": 1, **d}

    @classmethod
    def from_dict(cls, d: dict) -> "TimingProfile":
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

    def to_json(self, path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2))
        return path

    @classmethod
    def from_json(cls, path) -> "TimingProfile":
        return cls.from_dict(json.loads(Path(path).read_text()))


def _ct_points(ct: pd.DataFrame | None, keys: dict) -> pd.DataFrame:
    """Rows of the C_t micro-benchmark table that match a timing setting: k, t, context_len."""
    if ct is None or len(ct) == 0:
        return pd.DataFrame(columns=["k", "t", "context_len"])
    m = _match(ct, {k: v for k, v in keys.items() if k in ("hardware", "dtype", "target", "batch_size")})
    sub = ct[m]
    return pd.DataFrame({
        "k": sub["k"].to_numpy(int),
        "t": sub["t_forward"].to_numpy(float),
        "context_len": sub["context_len"].to_numpy(float) if "context_len" in sub.columns else np.nan,
    })


def _fit_context_terms(rs, ra, pts, cd_simple, ct1) -> ContextTerms:
    # C_t: one slope per context token, estimated within k (fixed effects), from the
    # chosen C_t points if their context varies within k, else from the rounds.
    beta = _within_slope(pts["k"], pts["context_len"], pts["t"]) if pts["context_len"].notna().all() else 0.0
    if beta == 0.0:
        rp = pd.concat([
            pd.DataFrame({"k": rs["gamma"].to_numpy(int) + 1, "L": rs["context_len"], "t": rs["t_verify"]}),
            pd.DataFrame({"k": np.ones(len(ra), int), "L": ra["context_len"], "t": ra["t_verify"]}),
        ], ignore_index=True)
        beta = _within_slope(rp["k"], rp["L"], rp["t"])
    L = pts["context_len"].fillna(0.0).to_numpy(float)
    ks, ts = fit_monotone_curve(pts["k"], pts["t"].to_numpy(float) - beta * L)
    # C_d: t_draft = a + γ·(b + c·L)
    a, b, c = cd_simple[0], cd_simple[1], 0.0
    if len(rs) >= 3:
        g = rs["gamma"].to_numpy(float)
        X = np.column_stack([np.ones(len(rs)), g, g * rs["context_len"].to_numpy(float)])
        if np.linalg.matrix_rank(X) == 3:
            a, b, c = (float(v) for v in _robust_lstsq(X, rs["t_draft"].to_numpy(float)))
    # C_t1(L): AR time per round (one token per row) vs context
    if len(ra) >= 2 and ra["context_len"].nunique() >= 2:
        L1 = ra["context_len"].to_numpy(float)
        t1 = (ra["t_round"] / (ra["committed"] / ra["rows"])).to_numpy(float)
        i1, s1 = _robust_lstsq(np.column_stack([np.ones_like(L1), L1]), t1)
    else:
        i1, s1 = ct1, 0.0
    return ContextTerms(ct_slope=float(beta), ct_k=ks, ct_t=ts, cd_intercept=a, cd_per_token=b,
                        cd_per_token_ctx=c, ct1_intercept=float(i1), ct1_slope=float(s1))


def fit_timing_profiles(rounds: pd.DataFrame, ct: pd.DataFrame | None = None, by=None, *, context: bool = True) -> dict:
    """TimingProfile per timing setting: {key tuple: profile}, keys = TIMING_KEYS present
    (or `by`). AR rows are matched to a setting ignoring draft/decoder."""
    sp = spec_rows(rounds)
    ar = ar_rows(rounds)
    keys = _keys(sp, by, TIMING_KEYS)
    out = {}
    for kd, sub in _iter_groups(sp, keys):
        rows = pd.concat([sub, ar[_match(ar, kd, ignore=_AR_IGNORE)]])
        out[tuple(kd.get(k) for k in keys)] = TimingProfile.from_rounds(rows, ct, context=context)
    return out


def timing_table(rounds: pd.DataFrame, ct: pd.DataFrame | None = None, by=None) -> pd.DataFrame:
    """One row per timing setting: the fitted component costs (seconds) and the C_t source."""
    keys = _keys(spec_rows(rounds), by, TIMING_KEYS)
    rows = []
    for kt, prof in fit_timing_profiles(rounds, ct, by=keys).items():
        rows.append({**dict(zip(keys, kt)), "cd_intercept": prof.cd_intercept, "cd_per_token": prof.cd_per_token,
                     "co_intercept": prof.co_intercept, "co_per_token": prof.co_per_token, "ct1": prof.ct1,
                     "ct_1": prof.c_t(1), "ct_max_k": max(prof.ct_k) if prof.ct_k else math.nan,
                     "ct_source": prof.ct_source, "n_rounds": prof.n_rounds})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- speedup model


def speedup_formula(accept_length, ct1, cd, ct, co=0.0):
    """S = E[N]·C_t1 / (C_d(γ) + C_t(γ+1) + C_o)."""
    if any(np.ndim(v) for v in (accept_length, ct1, cd, ct, co)):
        accept_length, ct1, cd, ct, co = (np.asarray(v, float) for v in (accept_length, ct1, cd, ct, co))
    return accept_length * ct1 / (cd + ct + co)


def ideal_speedup(accept_length, ct1, cd, ct):
    """S with C_o = 0: E[N]·C_t1 / (C_d(γ) + C_t(γ+1))."""
    return speedup_formula(accept_length, ct1, cd, ct, 0.0)


def predict_speedup(
    acceptance: AcceptanceProfile,
    timing: TimingProfile,
    gammas: Iterable[int],
    *,
    model: str = "positional",
    context_len: float | None = None,
) -> pd.DataFrame:
    """What-if: α_i from one profile, costs from another (e.g. a GPU timing profile).

    Columns: gamma, accept_length (of `model`), accept_length_single,
    accept_length_positional, c_d, c_t (at k = γ+1), c_o, c_t1, t_round, speedup,
    ideal_speedup. With `context_len`, the context-length variant of the timings is used
    (if the timing profile has one).
    """
    rows = []
    for g in gammas:
        g = int(g)
        es = acceptance.accept_length(g, "single")
        ep = acceptance.accept_length(g, "positional")
        en = ep if model == "positional" else es
        cd = timing.c_d(g, context_len)
        ctv = timing.c_t(g + 1, context_len)
        co = timing.c_o(g)
        ct1 = timing.c_t1(context_len)
        rows.append({"gamma": g, "accept_length": en, "accept_length_single": es, "accept_length_positional": ep,
                     "c_d": cd, "c_t": ctv, "c_o": co, "c_t1": ct1, "t_round": cd + ctv + co,
                     "speedup": speedup_formula(en, ct1, cd, ctv, co), "ideal_speedup": ideal_speedup(en, ct1, cd, ctv)})
    return pd.DataFrame(rows)


def optimal_gamma(acceptance: AcceptanceProfile, timing: TimingProfile, gamma_max: int = 16, **kw) -> tuple[int, float]:
    """Model-optimal γ over 1..gamma_max and its predicted speedup."""
    p = predict_speedup(acceptance, timing, range(1, gamma_max + 1), **kw)
    if p["speedup"].isna().all():
        return (0, math.nan)
    r = p.loc[p["speedup"].idxmax()]
    return (int(r["gamma"]), float(r["speedup"]))


# --------------------------------------------------------------------------- measured speedup


def paired_requests(requests: pd.DataFrame, basis: str = "wall") -> pd.DataFrame:
    """Pair each speculative request with the AR request of the same job/prompt_id/repeat.

    basis 'wall': time per token = wall_time / new_tokens (end to end, prefill included);
    basis 'decode': (wall_time − ttft) / (new_tokens − 1) (decode phase only, which is
    what the cost model describes; pairs with < 2 new tokens are dropped).
    ratio = AR time per token / speculative time per token. Keys are the speculative side's.
    """
    if basis not in ("wall", "decode"):
        raise ValueError(f"basis must be 'wall' or 'decode', got {basis!r}")
    dec = _decoder(requests)
    on = [c for c in ("job", "prompt_id", "repeat") if c in requests.columns]
    if not on:
        raise ValueError("requests need job/prompt_id/repeat columns to pair decoders")
    sp = requests[dec != AUTOREGRESSIVE]
    ar = requests[dec == AUTOREGRESSIVE][on + ["new_tokens", "wall_time", "ttft"]]
    if ar.duplicated(on).any():
        raise ValueError(f"several AR requests share {on}; cannot pair them unambiguously")
    m = sp.merge(ar.rename(columns={"new_tokens": "ar_new_tokens", "wall_time": "ar_wall_time", "ttft": "ar_ttft"}),
                 on=on, how="inner")

    def tpt(wall, ttft, new):
        if basis == "wall":
            return wall / new.where(new > 0)
        return (wall - ttft) / (new - 1).where(new > 1)

    m["spec_time_per_token"] = tpt(m["wall_time"], m["ttft"], m["new_tokens"])
    m["ar_time_per_token"] = tpt(m["ar_wall_time"], m["ar_ttft"], m["ar_new_tokens"])
    m["ratio"] = m["ar_time_per_token"] / m["spec_time_per_token"]
    return m[np.isfinite(m["ratio"]) & (m["ratio"] > 0)].reset_index(drop=True)


def measured_speedup(
    requests: pd.DataFrame,
    by=None,
    *,
    basis: str = "wall",
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Measured speedup per group: median over prompts of the per-prompt paired ratio
    (geometric mean over repeats), with a percentile-bootstrap CI over prompts.

    `requests` needs a `gamma` column to group by γ (see `add_gamma_setting`).
    Columns: by + [speedup, speedup_lo, speedup_hi, n_prompts, n_pairs,
    spec_tok_s, ar_tok_s] (tok/s = Σ new tokens / Σ wall time over the pairs).
    """
    pairs = paired_requests(requests, basis)
    keys = _keys(pairs, by, (*SETTING_KEYS, "gamma"))
    out = []
    for kd, sub in _iter_groups(pairs, keys):
        unit = [c for c in ("job", "decoder", "prompt_id") if c in sub.columns]
        per_prompt = np.exp(np.log(sub["ratio"]).groupby([sub[c] for c in unit]).mean())
        med, lo, hi = bootstrap_median_ci(per_prompt.to_numpy(), confidence, n_resamples, seed)
        out.append({**kd, "speedup": med, "speedup_lo": lo, "speedup_hi": hi, "n_prompts": len(per_prompt),
                    "n_pairs": len(sub),
                    "spec_tok_s": float(sub["new_tokens"].sum() / sub["wall_time"].sum()),
                    "ar_tok_s": float(sub["ar_new_tokens"].sum() / sub["ar_wall_time"].sum())})
    cols = keys + ["speedup", "speedup_lo", "speedup_hi", "n_prompts", "n_pairs", "spec_tok_s", "ar_tok_s"]
    return pd.DataFrame(out, columns=cols)


def _setting_keys(rounds: pd.DataFrame, by) -> list[str]:
    """`by` (default SETTING_KEYS present) plus any timing key that varies (a timing
    profile must be for one timing setting)."""
    sp = spec_rows(rounds)
    keys = _keys(sp, by, SETTING_KEYS)
    keys = [k for k in keys if k not in ("gamma", "gamma_setting")]
    for k in TIMING_KEYS:
        if k in sp.columns and k not in keys and sp[k].nunique(dropna=False) > 1:
            keys.append(k)
    return keys


def _group_rows(rounds: pd.DataFrame, kd: dict) -> pd.DataFrame:
    """Speculative rows of a setting plus the AR rows that share its timing keys."""
    sp = spec_rows(rounds)
    ar = ar_rows(rounds)
    return pd.concat([sp[_match(sp, kd)], ar[_match(ar, kd, ignore=_AR_IGNORE)]])


def fit_setting_profiles(
    rounds: pd.DataFrame, ct: pd.DataFrame | None = None, by=None, *, context: bool = False
) -> list[tuple[dict, AcceptanceProfile, TimingProfile]]:
    """(setting keys, acceptance profile, timing profile) per setting (SETTING_KEYS present,
    or `by` plus any varying timing key), each fitted on all the setting's rows and the
    AR rows that share its timing keys."""
    keys = _setting_keys(rounds, by)
    out = []
    for kd, _ in _iter_groups(spec_rows(rounds), keys):
        acc, tim = _fit_group(_group_rows(rounds, kd), ct, context=context)
        out.append((kd, acc, tim))
    return out


def _fit_group(rows: pd.DataFrame, ct, context: bool = True):
    return AcceptanceProfile.from_rounds(rows), TimingProfile.from_rounds(rows, ct, context=context)


def speedup_vs_model(
    rounds: pd.DataFrame,
    requests: pd.DataFrame,
    ct: pd.DataFrame | None = None,
    by=None,
    *,
    basis: str = "decode",
    gamma_max: int = 16,
    n_resamples: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Measured (paired, with CI) vs predicted speedup per setting and γ setting.

    Profiles are fitted on all rows of the setting. Columns: keys + [gamma, speedup,
    speedup_lo, speedup_hi, n_prompts, predicted, predicted_single, ideal, rel_error,
    model_gamma, model_speedup] (rel_error = predicted/measured − 1; model_gamma = the
    model-optimal γ over 1..gamma_max).
    """
    rounds, requests = add_gamma_setting(rounds, requests)
    keys = _setting_keys(rounds, by)
    meas = measured_speedup(requests, keys + ["gamma"], basis=basis, n_resamples=n_resamples, seed=seed)
    out = []
    for kd, _ in _iter_groups(spec_rows(rounds), keys):
        rows = _group_rows(rounds, kd)
        acc, tim = _fit_group(rows, ct, context=False)
        gopt, sopt = optimal_gamma(acc, tim, gamma_max)
        m = meas[_match(meas, kd)]
        for _, r in m.iterrows():
            g = int(r["gamma"])
            p = predict_speedup(acc, tim, [g]).iloc[0]
            ps = predict_speedup(acc, tim, [g], model="single").iloc[0]
            out.append({**kd, "gamma": g, "speedup": r["speedup"], "speedup_lo": r["speedup_lo"],
                        "speedup_hi": r["speedup_hi"], "n_prompts": r["n_prompts"], "predicted": p["speedup"],
                        "predicted_single": ps["speedup"], "ideal": p["ideal_speedup"],
                        "rel_error": p["speedup"] / r["speedup"] - 1, "model_gamma": gopt, "model_speedup": sopt})
    cols = keys + ["gamma", "speedup", "speedup_lo", "speedup_hi", "n_prompts", "predicted", "predicted_single",
                   "ideal", "rel_error", "model_gamma", "model_speedup"]
    return pd.DataFrame(out, columns=cols)


def leave_one_out(
    rounds: pd.DataFrame,
    requests: pd.DataFrame,
    ct: pd.DataFrame | None = None,
    by=None,
    *,
    basis: str = "decode",
    model: str = "positional",
    context: bool = False,
    n_resamples: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Leave-one-γ-out validation of the speedup model.

    For each setting and each γ setting, fit α (per position; positions beyond the
    other γ's largest are extrapolated with their single-α fit) and the timings (C_d, C_o
    fits, C_t1, C_t(k) — the `ct` micro-benchmark is used in full, it does not depend on
    γ) on the rows of the OTHER γ jobs only (their AR rows included), predict γ, and
    compare with its measured paired speedup. context=True uses the context-length
    variant, evaluated at the held-out job's mean round context length (a covariate
    known before running it: prompt lengths and max_new_tokens).
    Columns: keys + [gamma, speedup, speedup_lo, speedup_hi, predicted, rel_error,
    context_len, model].
    """
    rounds, requests = add_gamma_setting(rounds, requests)
    keys = _setting_keys(rounds, by)
    meas = measured_speedup(requests, keys + ["gamma"], basis=basis, n_resamples=n_resamples, seed=seed)
    out = []
    for kd, sub in _iter_groups(spec_rows(rounds), keys):
        rows = _group_rows(rounds, kd)
        gammas = sorted(int(g) for g in sub["gamma_setting"].dropna().unique())
        if len(gammas) < 2:
            continue
        for g in gammas:
            train = rows[rows["gamma_setting"] != g]
            held = sub[sub["gamma_setting"] == g]
            m = meas[_match(meas, {**kd, "gamma": g})]
            if spec_rows(train).empty or m.empty:
                continue
            acc = AcceptanceProfile.from_rounds(train)
            tim = TimingProfile.from_rounds(train, ct, context=context)
            L = float(round_level(held)["context_len"].mean()) if context else None
            p = predict_speedup(acc, tim, [g], model=model, context_len=L).iloc[0]
            r = m.iloc[0]
            out.append({**kd, "gamma": g, "speedup": r["speedup"], "speedup_lo": r["speedup_lo"],
                        "speedup_hi": r["speedup_hi"], "predicted": p["speedup"],
                        "rel_error": p["speedup"] / r["speedup"] - 1, "context_len": L,
                        "model": "context" if context else "simple"})
    cols = keys + ["gamma", "speedup", "speedup_lo", "speedup_hi", "predicted", "rel_error", "context_len", "model"]
    return pd.DataFrame(out, columns=cols)


def loo_summary(loo: pd.DataFrame) -> pd.DataFrame:
    """Median and max |relative error| of a `leave_one_out` frame, per setting and model."""
    keys = [c for c in loo.columns if c in (*SETTING_KEYS, "model")]
    out = []
    for kd, sub in _iter_groups(loo, keys):
        e = sub["rel_error"].abs()
        out.append({**kd, "median_abs_rel_error": float(e.median()), "max_abs_rel_error": float(e.max()),
                    "n_gammas": len(sub)})
    return pd.DataFrame(out, columns=keys + ["median_abs_rel_error", "max_abs_rel_error", "n_gammas"])


def compare_context_model(rounds, requests, ct=None, by=None, *, simple: pd.DataFrame | None = None,
                          **kw) -> pd.DataFrame:
    """LOO error of the simple vs the context-length model, per setting.

    `simple`: an already computed `leave_one_out(..., context=False)` frame (saves its
    recomputation). Columns: keys + [simple_median, simple_max, context_median,
    context_max, context_reduces_error] (errors are |relative errors|).
    """
    if simple is None:
        simple = leave_one_out(rounds, requests, ct, by, context=False, **kw)
    s = loo_summary(simple)
    c = loo_summary(leave_one_out(rounds, requests, ct, by, context=True, **kw))
    keys = [k for k in s.columns if k in SETTING_KEYS]
    s = s.drop(columns=["model", "n_gammas"]).rename(columns={"median_abs_rel_error": "simple_median",
                                                               "max_abs_rel_error": "simple_max"})
    c = c.drop(columns=["model"]).rename(columns={"median_abs_rel_error": "context_median",
                                                  "max_abs_rel_error": "context_max"})
    m = s.merge(c, on=keys, how="outer") if keys else pd.concat([s, c], axis=1)
    m["context_reduces_error"] = m["context_median"] < m["simple_median"]
    return m


# --------------------------------------------------------------------------- summaries


def summary_table(
    rounds: pd.DataFrame,
    requests: pd.DataFrame,
    by=None,
    *,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per setting: acceptance, accept length, tokens/s, paired speedup + CI.

    `by` defaults to the present keys among target, draft, decoder, workload, sampling,
    batch_size, gamma ("gamma" = the job's γ setting). Columns: by + [acceptance
    (Σaccepted/Σgamma), accept_length (mean accepted+1), spec_tok_s, ar_tok_s
    (Σ new tokens / Σ wall time over the paired requests), speedup, speedup_lo,
    speedup_hi (median of per-prompt end-to-end ratios, bootstrap CI), n_prompts].
    """
    rounds, requests = add_gamma_setting(rounds, requests)
    default = ("target", "draft", "decoder", "workload", "sampling", "max_new_tokens", "batch_size", "gamma")
    keys = _keys(requests, by, default)
    meas = measured_speedup(requests, keys, basis="wall", confidence=confidence, n_resamples=n_resamples, seed=seed)
    sp = spec_rows(rounds).rename(columns={"gamma": "gamma_row", "gamma_setting": "gamma"})
    rk = [k for k in keys if k in sp.columns]
    acc = []
    for kd, sub in _iter_groups(sp, rk):
        acc.append({**kd, "acceptance": sub["accepted"].sum() / sub["gamma_row"].sum(),
                    "accept_length": float((sub["accepted"] + 1).mean())})
    acc = pd.DataFrame(acc, columns=rk + ["acceptance", "accept_length"])
    out = meas.merge(acc, on=rk, how="left") if rk else meas.assign(**(acc.iloc[0].to_dict() if len(acc) else {}))
    cols = keys + ["acceptance", "accept_length", "spec_tok_s", "ar_tok_s", "speedup", "speedup_lo", "speedup_hi",
                   "n_prompts"]
    for c in cols:
        if c not in out.columns:
            out[c] = math.nan
    return out[cols]


def format_summary(df: pd.DataFrame) -> str:
    """The summary table as one screen of text."""
    if df.empty:
        return "(no paired speculative/autoregressive requests)"
    header = []
    if len(df) > 1:  # key columns with one value go to a header line
        const = [c for c in df.columns if c not in _SUMMARY_VALUES and df[c].nunique(dropna=False) == 1]
        header = [", ".join(f"{c}={df[c].iloc[0]}" for c in const)] if const else []
        df = df.drop(columns=const)
    t = pd.DataFrame(index=df.index)
    for c in df.columns:
        if c in ("acceptance",):
            t["accept"] = df[c].map(lambda v: "-" if pd.isna(v) else f"{100 * v:.1f}%")
        elif c == "accept_length":
            t["E[N]"] = df[c].map(lambda v: "-" if pd.isna(v) else f"{v:.2f}")
        elif c in ("spec_tok_s", "ar_tok_s"):
            t[{"spec_tok_s": "spec tok/s", "ar_tok_s": "AR tok/s"}[c]] = df[c].map(lambda v: f"{v:.1f}")
        elif c == "speedup":
            t["speedup [95% CI]"] = [_fmt_speedup(s, lo, hi) for s, lo, hi in
                                     zip(df["speedup"], df["speedup_lo"], df["speedup_hi"])]
        elif c in ("speedup_lo", "speedup_hi"):
            continue
        elif c == "n_prompts":
            t["prompts"] = df[c]
        elif c == "gamma":
            t["γ"] = df[c].map(lambda v: "-" if pd.isna(v) else str(int(v)))
        else:
            t[c] = df[c]
    return "\n".join(header + [t.to_string(index=False)])


_SUMMARY_VALUES = ("acceptance", "accept_length", "spec_tok_s", "ar_tok_s", "speedup", "speedup_lo", "speedup_hi",
                   "n_prompts")


def _fmt_speedup(s, lo, hi) -> str:
    if pd.isna(s):
        return "-"
    if pd.isna(lo):
        return f"{s:.2f}×"
    return f"{s:.2f}× [{lo:.2f}, {hi:.2f}]"


def recommendations(
    rounds: pd.DataFrame,
    requests: pd.DataFrame,
    ct: pd.DataFrame | None = None,
    by=("workload", "batch_size"),
    *,
    gamma_max: int = 16,
    n_resamples: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Per `by` (plus target/sampling/hardware/dtype if they vary): the measured best
    (decoder, draft, γ) by median end-to-end paired speedup, its CI, a verdict
    ('faster' if the CI lies above 1, 'slower' if below, else 'not significant'), and the
    cost model's optimal γ for that draft with its predicted speedup."""
    rounds, requests = add_gamma_setting(rounds, requests)
    by = [k for k in by if k in requests.columns]
    for k in ("target", "sampling", "hardware", "dtype"):
        if k in requests.columns and k not in by and requests[k].nunique(dropna=False) > 1:
            by.append(k)
    choice = [k for k in ("decoder", "draft", "gamma") if k in requests.columns]
    meas = measured_speedup(requests, by + choice, basis="wall", n_resamples=n_resamples, seed=seed)
    out = []
    for kd, sub in _iter_groups(meas, by):
        if sub["speedup"].isna().all():
            continue
        best = sub.loc[sub["speedup"].idxmax()]
        lo, hi = best["speedup_lo"], best["speedup_hi"]
        verdict = "faster" if lo > 1 else ("slower" if hi < 1 else "not significant")
        sel = {**kd, **{k: best[k] for k in choice if k != "gamma"}}
        rows = _group_rows(rounds, sel)
        gopt, sopt = (0, math.nan)
        if not spec_rows(rows).empty:
            try:
                acc, tim = _fit_group(rows, ct, context=False)
                gopt, sopt = optimal_gamma(acc, tim, gamma_max)
            except ValueError:  # mixed timing settings inside this selection
                pass
        out.append({**kd, **{k: best[k] for k in choice}, "speedup": best["speedup"], "speedup_lo": lo,
                    "speedup_hi": hi, "verdict": verdict, "model_gamma": gopt, "model_speedup": sopt})
    return pd.DataFrame(out, columns=by + choice + ["speedup", "speedup_lo", "speedup_hi", "verdict",
                                                    "model_gamma", "model_speedup"])


# --------------------------------------------------------------------------- synthetic rows


def synthetic_ct_time(k, batch_size=1, context_len=0.0, *, flat=0.020, per_token=0.0015, knee=8, ctx=0.0):
    """Ground-truth C_t for synthetic sweeps: flat up to `knee` tokens (k·batch), then
    rising by `per_token` per token, plus `ctx` seconds per context token."""
    return flat + per_token * np.maximum(0.0, np.asarray(k) * batch_size - knee) + ctx * np.asarray(context_len)


def synthetic_sweep(
    *,
    gammas: Sequence[int] = (1, 2, 3, 4, 5, 6),
    alphas: dict | None = None,
    drafts: dict | None = None,
    batch_sizes: Sequence[int] = (1,),
    n_prompts: int = 12,
    new_tokens: int = 96,
    prompt_tokens: tuple[int, int] = (32, 256),
    repeats: int = 1,
    ct: dict | None = None,
    co: tuple[float, float] = (0.0010, 0.0002),
    co_ar: float = 0.0005,
    cd_ctx: float = 0.0,
    job_context: dict | None = None,
    noise: float = 0.02,
    ct_ks: Sequence[int] = tuple(range(1, 17)),
    ct_contexts: Sequence[int] = (128,),
    hardware: str = "cpu:synthetic",
    dtype: str = "bfloat16",
    target: str = "synthetic-target",
    sampling: str = "greedy",
    seed: int = 0,
) -> dict[str, pd.DataFrame]:
    """Simulated sweep with known parameters, in the raw row schema (for tests and demos).

    alphas: {workload: per-position α (the last value repeats)}; drafts: {name: (C_d
    intercept, C_d per token)}; ct: keyword arguments of `synthetic_ct_time`; co: C_o =
    co[0] + co[1]·γ; co_ar: overhead of an AR step; cd_ctx: extra draft seconds per
    drafted token per context token; job_context: {γ: extra prompt tokens of that γ's
    jobs}. Speculative and AR runs of each prompt batch are interleaved and paired.
    Returns {"rounds", "requests", "ct"} DataFrames.
    """
    rng = np.random.default_rng(seed)
    alphas = alphas or {"chat": (0.85, 0.75, 0.65, 0.6)}
    drafts = drafts or {"tiny": (0.0010, 0.0030)}
    ctp = {"flat": 0.020, "per_token": 0.0015, "knee": 8, "ctx": 0.0, **(ct or {})}
    job_context = job_context or {}
    rcols: dict[str, list] = {c: [] for c in ("round", "row", "gamma", "accepted", "extra", "committed", "n_active",
                                              "context_len", "t_draft", "t_verify", "t_overhead", "t_round")}
    rkeys: list[dict] = []
    reqs: list[dict] = []

    def jitter(n=None):
        return rng.lognormal(0.0, noise, n) if noise > 0 else (np.ones(n) if n else 1.0)

    for wl, al in alphas.items():
        al = np.asarray(al, float)
        plens = rng.integers(prompt_tokens[0], prompt_tokens[1] + 1, size=n_prompts)
        for dname, (cd_i, cd_s) in drafts.items():
            for b in batch_sizes:
                for g in gammas:
                    job = f"{wl}_{dname}_b{b}_g{g}"
                    base = dict(job=job, target=target, draft=dname, draft_kind="model", workload=wl, category=wl,
                                sampling=sampling, temperature=0.0, top_k=0, top_p=1.0, batch_size=b, dtype=dtype,
                                hardware=hardware)
                    pos_alpha = np.array([al[min(i, len(al) - 1)] for i in range(g)])
                    for rep in range(repeats):
                        for start in range(0, n_prompts, b):
                            ids = list(range(start, min(start + b, n_prompts)))
                            plen = plens[ids] + job_context.get(g, 0)
                            for decoder in (AUTOREGRESSIVE, SPECULATIVE):
                                gg = g if decoder == SPECULATIVE else 0
                                keys = {**base, "decoder": decoder, "repeat": rep, "batch": start // b}
                                n = len(ids)
                                gen = np.ones(n, int)  # prefill produced the first token
                                finish = np.zeros(n)
                                nrounds = np.zeros(n, int)
                                ttft = 0.002 + 2e-5 * plen.sum() * (1.3 if gg else 1.0)
                                t, r = 0.0, 0
                                while True:
                                    act = np.nonzero(gen < new_tokens)[0]
                                    if len(act) == 0:
                                        break
                                    ctx_len = plen[act] + gen[act]
                                    L = float(ctx_len.mean())
                                    if gg:
                                        acc_mask = rng.random((len(act), gg)) < pos_alpha
                                        accepted = np.cumprod(acc_mask, axis=1).sum(axis=1)
                                        td = (cd_i + gg * (cd_s + cd_ctx * L)) * jitter()
                                        tv = synthetic_ct_time(gg + 1, len(act), L, **ctp) * jitter()
                                        to = (co[0] + co[1] * gg) * jitter()
                                    else:
                                        accepted = np.zeros(len(act), int)
                                        td = 0.0
                                        tv = synthetic_ct_time(1, len(act), L, **ctp) * jitter()
                                        to = co_ar * jitter()
                                    tr = td + tv + to
                                    committed = np.minimum(accepted + 1, new_tokens - gen[act])
                                    extra = ([BONUS if a == gg else RECOVERED for a in accepted] if gg
                                             else [AUTOREGRESSIVE_STEP] * len(act))
                                    k = len(act)
                                    rcols["round"] += [r] * k
                                    rcols["row"] += act.tolist()
                                    rcols["gamma"] += [gg] * k
                                    rcols["accepted"] += accepted.tolist()
                                    rcols["extra"] += extra
                                    rcols["committed"] += committed.tolist()
                                    rcols["n_active"] += [k] * k
                                    rcols["context_len"] += ctx_len.tolist()
                                    rcols["t_draft"] += [td] * k
                                    rcols["t_verify"] += [tv] * k
                                    rcols["t_overhead"] += [to] * k
                                    rcols["t_round"] += [tr] * k
                                    for i in act:
                                        rkeys.append({**keys, "prompt_id": f"{wl}-{ids[i]}"})
                                    t += tr
                                    gen[act] += committed
                                    nrounds[act] += 1
                                    finish[act] = t
                                    r += 1
                                for i in range(n):
                                    reqs.append({"row": i, "prompt_tokens": int(plen[i]), "new_tokens": int(gen[i]),
                                                 "rounds": int(nrounds[i]), "wall_time": ttft + finish[i],
                                                 "ttft": ttft, "finished_by": "max_new_tokens", **keys,
                                                 "prompt_id": f"{wl}-{ids[i]}"})
    rounds = pd.concat([pd.DataFrame(rcols), pd.DataFrame(rkeys)], axis=1)
    requests = pd.DataFrame(reqs)
    ctrows = []
    for b in batch_sizes:
        for k in ct_ks:
            for L in ct_contexts:
                for rep in range(3):
                    ctrows.append({"hardware": hardware, "dtype": dtype, "target": target, "batch_size": b, "k": k,
                                   "context_len": L, "repeat": rep,
                                   "t_forward": float(synthetic_ct_time(k, b, L, **ctp) * jitter())})
    return {"rounds": rounds, "requests": requests, "ct": pd.DataFrame(ctrows)}

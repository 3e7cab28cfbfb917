"""Statistics used by the analysis: proportion and median CIs, monotone curves, robust line fits."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import optimize, stats

# What `median_ci` computes, for table headers and the README.
MEDIAN_CI_METHOD = "median, exact order-statistic (binomial) CI"


def proportion_ci(successes: int, trials: int, confidence: float = 0.95, method: str = "wilson") -> tuple[float, float]:
    """Binomial proportion CI (scipy binomtest): 'wilson' or 'exact' (Clopper-Pearson). NaN if trials == 0."""
    if trials <= 0:
        return (math.nan, math.nan)
    ci = stats.binomtest(int(successes), int(trials)).proportion_ci(confidence_level=confidence, method=method)
    return (float(ci.low), float(ci.high))


def median_ci_rank(n: int, confidence: float = 0.95) -> int:
    """1-based rank k of the order-statistic CI [x_(k), x_(n+1-k)] for the median of n values:
    the largest k whose coverage 1 − 2·P(Binom(n, ½) ≤ k−1) is at least `confidence`; 0 if even
    [min, max] covers less (n too small for that level, e.g. n < 6 at 95%)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    tail = (1 - confidence) / 2
    k = int(stats.binom.ppf(tail, n, 0.5))  # smallest k with P(B <= k) >= tail
    while k >= 1 and stats.binom.cdf(k - 1, n, 0.5) > tail:
        k -= 1
    while stats.binom.cdf(k, n, 0.5) <= tail:  # ppf rounding: move up while still within the level
        k += 1
    return max(k, 0)


def median_ci(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """(median, lo, hi): exact distribution-free CI for the median from order statistics.

    Coverage is at least `confidence` for any continuous distribution and any n (unlike a
    percentile bootstrap, which under-covers at n < 20). The bounds are NaN when n is too
    small for the level (n < 6 at 95%); identical values give lo == hi == the value.
    """
    x = np.sort(np.asarray(values, float))
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return (math.nan, math.nan, math.nan)
    med = float(np.median(x))
    k = median_ci_rank(len(x), confidence)
    if k < 1:
        return (med, math.nan, math.nan)
    return (med, float(x[k - 1]), float(x[len(x) - k]))


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


def linear_fit(x, y, single: str = "origin", w=None) -> tuple[float, float]:
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


def robust_lstsq(X, y) -> np.ndarray:
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


def within_slope(group, x, y) -> float:
    """Slope of y on x within groups (fixed effects: x and y centred per group), robust
    fit; 0 if x does not vary within groups."""
    df = pd.DataFrame({"g": np.asarray(group), "x": np.asarray(x, float), "y": np.asarray(y, float)}).dropna()
    if df.empty:
        return 0.0
    dx = (df["x"] - df.groupby("g")["x"].transform("mean")).to_numpy()
    dy = (df["y"] - df.groupby("g")["y"].transform("mean")).to_numpy()
    if float((dx * dx).sum()) <= 1e-12:
        return 0.0
    return float(robust_lstsq(dx[:, None], dy)[0])

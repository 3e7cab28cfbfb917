"""The audit's statistics: goodness of fit, two-sample G-tests, Holm, TV estimates and power.

See the package docstring for what each quantity means and why it is computed this way.
"""

from __future__ import annotations

import numpy as np
from scipy import optimize, stats

from specbench.audit.settings import AuditSettings


def _pool_gof(obs: np.ndarray, prob: np.ndarray, n: int, min_expected: float) -> tuple[np.ndarray, np.ndarray]:
    """Bins for a goodness-of-fit test: categories in decreasing p, the tail pooled into 'other'."""
    order = np.argsort(-prob, kind="stable")
    obs, prob = obs[order], prob[order]
    keep = int(np.sum(n * prob >= min_expected))
    while keep > 0 and keep < len(prob) and n * prob[keep:].sum() < min_expected:
        keep -= 1
    bins_o = list(obs[:keep]) + ([obs[keep:].sum()] if keep < len(prob) else [])
    bins_p = list(prob[:keep]) + ([prob[keep:].sum()] if keep < len(prob) else [])
    return np.asarray(bins_o, dtype=float), np.asarray(bins_p, dtype=float)


def _pool_two_sample(a: np.ndarray, b: np.ndarray, min_expected: float) -> tuple[np.ndarray, np.ndarray]:
    """Bins for a 2 x K table: categories in decreasing pooled count, the tail pooled into 'other'."""
    pooled = a + b
    order = np.argsort(-pooled, kind="stable")
    a, b, pooled = a[order], b[order], pooled[order]
    scale = min(a.sum(), b.sum()) / pooled.sum()  # the smaller row's expected count per pooled count
    keep = int(np.sum(pooled * scale >= min_expected))
    while keep > 0 and keep < len(pooled) and pooled[keep:].sum() * scale < min_expected:
        keep -= 1
    tail = keep < len(pooled)
    return (
        np.asarray(list(a[:keep]) + ([a[keep:].sum()] if tail else []), dtype=float),
        np.asarray(list(b[:keep]) + ([b[keep:].sum()] if tail else []), dtype=float),
    )


def _tv_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return 0.5 * np.abs(x - y).sum(-1)


def _tv_estimate(plugin: float, boot: np.ndarray, ci: float) -> tuple[float, float, float]:
    """Bias-corrected TV and its basic (reverse-percentile) bootstrap interval, clipped to [0, 1].

    The plug-in TV is biased upward (sampling noise adds |d| in every bin); the bootstrap
    estimates that bias as mean(boot) - plugin, and the basic interval
    [2 plugin - q_hi, 2 plugin - q_lo] is centred on the corrected estimate.
    """
    if len(boot) == 0:
        return plugin, float("nan"), float("nan")
    q_lo, q_hi = np.quantile(boot, [(1 - ci) / 2, (1 + ci) / 2])
    clip = lambda v: float(min(1.0, max(0.0, v)))  # noqa: E731
    return clip(2 * plugin - boot.mean()), clip(2 * plugin - q_hi), clip(2 * plugin - q_lo)


def _result(kind, n, n_ref, bins, statistic, p_value, plugin, boot, tv_null, n_eff, ci) -> dict:
    """One test's row: counts, statistic and p-value, the TV estimate with its interval and noise floor."""
    tv, lo, hi = _tv_estimate(plugin, boot, ci)
    return dict(
        kind=kind,
        n=n,
        n_ref=n_ref,
        bins=bins,
        statistic=float(statistic),
        p_value=float(p_value),
        tv=tv,
        tv_lo=lo,
        tv_hi=hi,
        tv_plugin=plugin,
        tv_null=tv_null,
        n_eff=float(n_eff),
    )


def gof_test(obs: np.ndarray, prob: np.ndarray, settings: AuditSettings, rng: np.random.Generator) -> dict | None:
    """Chi-square goodness of fit of counts `obs` against probabilities `prob` (same categories).

    Observed outcomes of probability 0 make it a failed "support" test (p-value 0): the
    target can never produce them. They enter the TV as one extra bin of probability 0.
    """
    n = int(obs.sum())
    if n == 0:
        return None
    impossible = float(obs[prob <= 0].sum())
    o, p = _pool_gof(obs[prob > 0], prob[prob > 0], n, settings.min_expected)
    if len(o) < 2 and not impossible:
        return None
    p = p / p.sum()
    if impossible:
        kind, statistic, p_value = "support", float("inf"), 0.0
        o, p = np.append(o, impossible), np.append(p, 0.0)
    else:
        kind = "gof"
        statistic, p_value = stats.chisquare(o, p * n)
    phat = o / n
    plugin = float(_tv_rows(phat, p))
    boot = _tv_rows(rng.multinomial(n, phat, size=settings.bootstrap) / n, p) if settings.bootstrap else np.zeros(0)
    null = rng.multinomial(n, p, size=max(settings.bootstrap, 200)) / n
    tv_null = float(_tv_rows(null, p).mean())
    return _result(kind, n, None, len(o), statistic, p_value, plugin, boot, tv_null, float(n), settings.ci)


def two_sample_test(a: np.ndarray, b: np.ndarray, settings: AuditSettings, rng: np.random.Generator) -> dict | None:
    """G-test on the 2 x K table of decoder counts `a` and reference counts `b` (same categories)."""
    na, nb = int(a.sum()), int(b.sum())
    if na == 0 or nb == 0:
        return None
    x, y = _pool_two_sample(a, b, settings.min_expected)
    if len(x) < 2:
        return None
    statistic, p_value, _, _ = stats.chi2_contingency(np.stack([x, y]), correction=False, lambda_="log-likelihood")
    pa, pb = x / na, y / nb
    plugin = float(_tv_rows(pa, pb))
    r = settings.bootstrap
    boot = _tv_rows(rng.multinomial(na, pa, size=r) / na, rng.multinomial(nb, pb, size=r) / nb) if r else np.zeros(0)
    pooled = (x + y) / (na + nb)
    rn = max(r, 200)
    tv_null = _tv_rows(rng.multinomial(na, pooled, size=rn) / na, rng.multinomial(nb, pooled, size=rn) / nb).mean()
    return _result(
        "g-test", na, nb, len(x), statistic, p_value, plugin, boot, float(tv_null), na * nb / (na + nb), settings.ci
    )


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values (family-wise error control under any dependence)."""
    p = np.asarray(p_values, dtype=float)
    m = len(p)
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adjusted
    return out


def noncentrality_for_power(df: int, level: float, power: float) -> float:
    """lambda such that a chi-square test with df degrees of freedom at `level` has this power."""
    crit = stats.chi2.isf(level, df)
    f = lambda lam: stats.ncx2.sf(crit, df, lam) - power  # noqa: E731
    hi = 10.0
    while f(hi) < 0:
        hi *= 2
    return float(optimize.brentq(f, 1e-9, hi, xtol=1e-6))


def detectable_tv(df: int, n_eff: float, level: float, power: float) -> float:
    """Smallest TV (on the test's bins) detected with `power` at `level`, for any deviation shape."""
    return float(np.sqrt(noncentrality_for_power(df, level, power) / (4.0 * n_eff)))

"""Acceptance: per-position α_i, the single-α fit, E[N] formulas (with and without the
max_new_tokens truncation of a request's last round) and the `AcceptanceProfile`.

α_i = P(accepted ≥ i | accepted ≥ i−1), counted over the rows that drafted position i
(``gamma ≥ i``). The accept length of a round is ``accepted + 1`` and *not* ``committed``:
``committed`` is truncated at EOS / max_new_tokens, a property of the request, not of the
draft; that truncation is modelled separately (:func:`tokens_per_round`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from specbench.analysis.jsonio import JsonFile
from specbench.analysis.rows import ACCEPTANCE_KEYS, group_keys, iter_groups, native, spec_rows
from specbench.analysis.stats import proportion_ci

ACCEPT_LENGTH_MODELS = ("positional", "single")


def check_acceptance(df: pd.DataFrame) -> None:
    """ValueError if any round row has accepted outside [0, gamma]."""
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
    check_acceptance(sp)
    keys = group_keys(sp, by, ACCEPTANCE_KEYS)
    out = []
    for kd, sub in iter_groups(sp, keys):
        trials, succ = position_counts(sub["accepted"], sub["gamma"])
        for i, (n, k) in enumerate(zip(trials, succ), start=1):
            lo, hi = proportion_ci(k, n, confidence, method)
            out.append(
                {
                    **kd,
                    "position": i,
                    "trials": int(n),
                    "successes": int(k),
                    "alpha": k / n if n else math.nan,
                    "alpha_lo": lo,
                    "alpha_hi": hi,
                }
            )
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
    check_acceptance(sp)
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


def accept_length_pmf(alphas: Sequence[float], gamma: int) -> np.ndarray:
    """P(N = n) for n = 1..γ+1 from per-position α_1..α_γ: Π_{j<n} α_j · (1 − α_n), and Π_{j≤γ} α_j at γ+1."""
    al = np.asarray(list(alphas)[:gamma], float)
    if len(al) < gamma:
        raise ValueError(f"need {gamma} per-position alphas, got {len(al)}")
    surv = np.concatenate([[1.0], np.cumprod(al)])  # [γ+1]: P(accepted ≥ i) for i = 0..γ
    return np.concatenate([surv[:-1] - surv[1:], surv[-1:]])


def tokens_per_round(pmf: Sequence[float], budget: int | None) -> float:
    """Expected tokens committed per round by a request that has `budget` tokens left to
    decode, when each round would commit N ~ pmf (N = 1..len(pmf)) but the last round only
    commits what fits: budget / E[rounds(budget)], with E[rounds(r)] = 1 + Σ_n P(N=n)·E[rounds(max(r−n, 0))].

    budget None: no truncation, E[N]. It tends to E[N] as budget grows; at short outputs it is
    lower (the tokens accepted past max_new_tokens in each request's last round are thrown away).
    """
    p = np.asarray(pmf, float)
    if budget is None:
        return float((np.arange(1, len(p) + 1) * p).sum())
    budget = int(budget)
    if budget < 1:
        raise ValueError(f"budget (tokens left to decode) must be >= 1, got {budget}")
    n = np.arange(1, len(p) + 1)
    rounds = np.zeros(budget + 1)
    for r in range(1, budget + 1):
        rounds[r] = 1.0 + p @ rounds[np.maximum(r - n, 0)]
    return float(budget / rounds[budget])


@dataclass
class AcceptanceProfile(JsonFile):
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
    def from_rounds(cls, rounds: pd.DataFrame, keys: dict | None = None) -> AcceptanceProfile:
        """Fit from the speculative round rows (all γ pooled); `keys` default: the acceptance keys with one value."""
        sp = spec_rows(rounds)
        check_acceptance(sp)
        trials, succ = position_counts(sp["accepted"], sp["gamma"])
        fit = fit_alpha(sp)
        if keys is None:
            keys = {}
            for k in ACCEPTANCE_KEYS:
                if k in sp.columns:
                    vals = sp[k].dropna().unique()
                    if len(vals) == 1:
                        keys[k] = native(vals[0])
        return cls(
            alphas=[float(s / t) if t else math.nan for s, t in zip(succ, trials)],
            trials=[int(t) for t in trials],
            successes=[int(s) for s in succ],
            alpha=fit.alpha,
            alpha_trials=fit.trials,
            alpha_successes=fit.successes,
            keys={k: native(v) for k, v in keys.items()},
            n_rounds=int(len(sp)),
        )

    def alpha_at(self, i: int) -> float:
        """α_i: measured if position i was tested, else the single-α fit."""
        if 1 <= i <= len(self.alphas) and self.trials[i - 1] > 0:
            return self.alphas[i - 1]
        return self.alpha

    def alpha_profile(self, gamma: int, model: str = "positional") -> list[float]:
        """α_1..α_γ of `model`: 'positional' (measured, extrapolated) or 'single' (α everywhere)."""
        if model not in ACCEPT_LENGTH_MODELS:
            raise ValueError(f"model must be one of {ACCEPT_LENGTH_MODELS}, got {model!r}")
        if model == "single":
            return [self.alpha] * gamma
        return [self.alpha_at(i) for i in range(1, gamma + 1)]

    def accept_length(self, gamma: int, model: str = "positional") -> float:
        """Predicted E[N] at γ: model 'positional' (α_i, extrapolated) or 'single' (α)."""
        al = self.alpha_profile(gamma, model)
        if any(math.isnan(a) for a in al) or (model == "single" and math.isnan(self.alpha)):
            return math.nan
        if model == "single":
            return expected_accept_length(self.alpha, gamma)
        return expected_accept_length_positional(al, gamma)

    def tokens_per_round(self, gamma: int, budget: int | None, model: str = "positional") -> float:
        """Expected tokens committed per round at γ for requests with `budget` tokens to decode (None: E[N])."""
        al = self.alpha_profile(gamma, model)
        if any(math.isnan(a) for a in al) or math.isnan(self.alpha):
            return math.nan
        return tokens_per_round(accept_length_pmf(al, gamma), budget)

    def to_dict(self) -> dict:
        """JSON-ready dict (NaN as None) with a kind/version header."""
        d = asdict(self)
        d["alphas"] = [native(a) for a in self.alphas]
        d["alpha"] = native(self.alpha)
        return {"kind": "AcceptanceProfile", "version": 1, **d}

    @classmethod
    def from_dict(cls, d: dict) -> AcceptanceProfile:
        """Inverse of `to_dict`."""
        d = {k: v for k, v in d.items() if k not in ("kind", "version")}
        d["alphas"] = [math.nan if a is None else float(a) for a in d["alphas"]]
        d["alpha"] = math.nan if d["alpha"] is None else float(d["alpha"])
        return cls(**d)

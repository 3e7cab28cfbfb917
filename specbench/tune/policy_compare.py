"""A study's best draft-length policy against its best fixed γ, paired batch by batch.

Both arms ran on the same prompt batches with the same seeds, each beside its own plain decoding, so
their per-batch speedups pair: the ratio policy / fixed per batch, its median with the exact
order-statistic CI (`analysis.stats.median_ci`), and the Wilcoxon signed-rank p (`paired.paired_p`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specbench.analysis.stats import median_ci
from specbench.tune.objectives import is_better
from specbench.tune.paired import batch_speedups, log_ratios, paired_p
from specbench.tune.samplers import FIXED, Arm

COLUMNS = [
    "best_fixed",
    "best_policy",
    "policy_vs_fixed",
    "policy_vs_fixed_lo",
    "policy_vs_fixed_hi",
    "policy_vs_fixed_p",
    "policy_vs_fixed_n",
]


def _best(arms: list[Arm], values: dict[Arm, float], objective: str) -> Arm | None:
    best = None
    for a in arms:
        if math.isfinite(values[a]) and (best is None or is_better(values[a], values[best], objective)):
            best = a
    return best


def policy_vs_fixed(
    by_arm: dict[Arm, pd.DataFrame], values: dict[Arm, float], objective: str, confidence: float = 0.95
) -> dict:
    """`COLUMNS` for one study: the best fixed-γ arm, the best arm of any other policy, and the paired
    ratio of their objective speedups (> 1: the policy is faster). NaN / None where either is missing."""
    empty = dict.fromkeys(COLUMNS) | {c: math.nan for c in COLUMNS[2:]}
    fixed = _best([a for a in values if a.policy in (None, FIXED)], values, objective)
    other = _best([a for a in values if a.policy not in (None, FIXED)], values, objective)
    if fixed is None or other is None:
        return empty
    a, b = batch_speedups(by_arm[other], objective), batch_speedups(by_arm[fixed], objective)
    ratios = np.exp(log_ratios(a, b))
    med, lo, hi = median_ci(ratios, confidence)
    return {
        "best_fixed": fixed.label(),
        "best_policy": other.label(),
        "policy_vs_fixed": med,
        "policy_vs_fixed_lo": lo,
        "policy_vs_fixed_hi": hi,
        "policy_vs_fixed_p": paired_p(a, b),
        "policy_vs_fixed_n": len(ratios),
    }


def format_cell(r) -> str:
    """'policy arm / fixed arm: ratio× [lo, hi] (p, n)' for a recommendation row, '-' without both."""
    if not isinstance(r.get("best_policy"), str) or not math.isfinite(r.get("policy_vs_fixed", math.nan)):
        return "-"
    ci = (
        f" [{r['policy_vs_fixed_lo']:.2f}, {r['policy_vs_fixed_hi']:.2f}]"
        if math.isfinite(r["policy_vs_fixed_lo"])
        else ""
    )
    return (
        f"{r['best_policy']} / {r['best_fixed']}: {r['policy_vs_fixed']:.2f}×{ci} "
        f"(p={r['policy_vs_fixed_p']:.2f}, n={int(r['policy_vs_fixed_n'])})"
    )

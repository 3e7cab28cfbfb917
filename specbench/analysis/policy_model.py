"""Cost model of a variable draft length: a draft-length policy with threshold tau, predicted from round rows.

The rows (`RoundRecord`) keep the draft's confidence q(x_i) at every position it drafted, dropped ones
included, so one run at a fixed gamma_max is enough to replay any tau offline:

1. `fit_accept_curve`: P(accept x_i | q(x_i), x_1..x_{i-1} accepted), binned on q(x_i) (quantile bins,
   Laplace-smoothed), from every verified position that was reached;
2. `predict_policy`: per recorded round, the policy's kept length L(tau) (its own rule, on the
   recorded confidences), E[N] = 1 + sum_{i<=L} prod_{j<=i} a(q(x_j)), and the round's cost
   C_d(D) + C_t(L + 1) + C_o(L), where D is what the draft drafted: gamma_max (specbench's draft drafts its
   whole gamma, then the policy cuts) or, with `draft_stops=True`, L (plus the dropped one);
   speedup = C_t1 * sum E[N] / sum cost (a ratio of sums, as the measured tokens / time);
3. `choose_tau`: the tau maximizing the predicted speedup over a grid, without running them.

Drafts that often propose nothing (n-gram lookup without a match; llama.cpp's n-gram drafts only when
its m-gram is long enough): a round that drafted nothing commits one token at the cost of a plain
step. The fixed-gamma model assumed every round drafts gamma and was 22-43% optimistic for them; here
the share of such rounds is `no_draft_share` (rows with drafted == 0, or llama.cpp's plain steps
between drafting rounds), and they enter E[N] as 1 and the cost as C_t(1) + C_o(0) (`no_draft_cost`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specbench.decoding.policies import POLICIES, DraftPolicy


def _confidence_rows(rounds: pd.DataFrame) -> pd.DataFrame:
    """Round rows of a speculative decoder that recorded the draft's confidence."""
    has = rounds["q_drafted"].map(lambda v: v is not None and len(v) > 0)
    return rounds[has & (rounds["gamma"] > 0)]


def fit_accept_curve(rounds: pd.DataFrame, bins: int = 8) -> pd.DataFrame:
    """P(accept | q(x_i)) per quantile bin of q(x_i): columns lo, hi, n, accepted, p_accept."""
    xs, ys = [], []
    for q_x, accepted, drafted in _confidence_rows(rounds)[["q_drafted", "accepted", "drafted"]].itertuples(
        index=False
    ):
        for i in range(min(int(accepted) + 1, int(drafted))):  # reached and verified positions
            xs.append(float(q_x[i]))
            ys.append(i < accepted)
    if not xs:
        raise ValueError("fit_accept_curve: no verified draft position with a recorded q(x_i)")
    x, y = np.asarray(xs), np.asarray(ys, float)
    inner = np.quantile(x, np.linspace(0, 1, bins + 1))[1:-1]
    edges = np.unique(np.concatenate([[0.0], inner[(inner > 0) & (inner < 1)], [1.0 + 1e-12]]))
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    rows = []
    for b in range(len(edges) - 1):
        inside = which == b
        n, k = int(inside.sum()), float(y[inside].sum())
        rows.append({"lo": edges[b], "hi": edges[b + 1], "n": n, "accepted": k, "p_accept": (k + 1) / (n + 2)})
    return pd.DataFrame(rows)


def accept_probability(curve: pd.DataFrame, q_x) -> np.ndarray:
    """The fitted P(accept) at confidences q_x (array-like)."""
    lo = curve["lo"].to_numpy()
    idx = np.clip(np.searchsorted(lo, np.asarray(q_x, float), side="right") - 1, 0, len(lo) - 1)
    return curve["p_accept"].to_numpy()[idx]


def kept_length(policy: DraftPolicy, q_x, tau: float, gamma: int) -> tuple[int, int]:
    """(drafts verified, drafts the draft produced up to its decision) for one round's confidences."""
    for i, value in enumerate(list(q_x)[:gamma]):
        if policy.drop is not None and policy.drop(value, tau):
            return i, i + 1
        if policy.stop_after is not None and policy.stop_after(value, tau):
            return i + 1, i + 1
    return gamma, gamma


def no_draft_share(rounds: pd.DataFrame) -> float:
    """Share of a speculative decoder's rounds that drafted nothing (drafted == 0, or gamma-0 plain steps)."""
    if rounds.empty:
        return math.nan
    drafted = rounds["drafted"] if "drafted" in rounds else rounds["gamma"]
    nothing = (drafted == 0) | (rounds["gamma"] == 0)
    return float(nothing.mean())


def predict_policy(
    rounds: pd.DataFrame,
    curve: pd.DataFrame,
    timing,
    policy: str,
    tau: float,
    gamma: int | None = None,
    *,
    draft_stops: bool = False,
    proposed: bool = True,
    no_draft: float = 0.0,
    no_draft_cost: float | None = None,
) -> dict:
    """Predicted drafted tokens per round, E[N] and speedup of `policy` at `tau` (up to `gamma` drafts).

    `timing`: anything with c_d(gamma), c_t(k), c_o(gamma), c_t1() (an `analysis.timing.TimingProfile`).
    `proposed`: a round verifies at most what its draft proposed (the row's recorded `drafted`, from a run
    whose policy cut nothing: fixed gamma): n-gram lookup's short and empty proposals; False: the draft
    always proposes gamma (the fixed-gamma model's assumption). `no_draft`: share of further rounds, not in
    `rounds`, in which the draft proposed nothing (llama.cpp's plain steps between drafting rounds); each
    commits 1 token at `no_draft_cost` (default C_t(1) + C_o(0)).
    """
    rule = POLICIES.get(policy, "policy")
    rows = _confidence_rows(rounds)
    g_max = int(gamma or rows["gamma"].max())
    lengths, produced, e_n, cost = [], [], [], []
    for q_x, offered in rows[["q_drafted", "drafted"]].itertuples(index=False):
        q_x = list(q_x)[: min(g_max, offered) if proposed else g_max]
        length, made = kept_length(rule, q_x, tau, len(q_x))
        a = np.cumprod(accept_probability(curve, q_x[:length])) if length else np.zeros(0)
        lengths.append(length)
        produced.append(made if draft_stops else g_max)
        e_n.append(1.0 + float(a.sum()))
        # C_o at the verified length: acceptance, residual and rollback work over what was verified, not over
        # gamma_max (at c_o(gamma_max) n-gram rounds that verify nothing cost a gamma-4 round's overhead)
        cost.append(float(timing.c_d(produced[-1])) + float(timing.c_t(length + 1)) + float(timing.c_o(length)))
    skip_cost = float(timing.c_t(1)) + float(timing.c_o(0)) if no_draft_cost is None else no_draft_cost
    tokens = (1 - no_draft) * float(np.mean(e_n)) + no_draft * 1.0
    seconds = (1 - no_draft) * float(np.mean(cost)) + no_draft * skip_cost
    return {
        "policy": policy,
        "tau": tau,
        "gamma": g_max,
        "drafted": (1 - no_draft) * float(np.mean(lengths)),
        "accept_length": tokens,
        "t_round": seconds,
        "predicted_speedup": tokens * float(timing.c_t1()) / seconds,
    }


def choose_tau(rounds, curve, timing, policy: str, taus, gamma: int | None = None, **kw) -> pd.DataFrame:
    """Predictions over a tau grid, best first (the model's tau* is the first row)."""
    table = pd.DataFrame([predict_policy(rounds, curve, timing, policy, float(t), gamma, **kw) for t in taus])
    return table.sort_values("predicted_speedup", ascending=False, ignore_index=True)


def measured_policy(rounds: pd.DataFrame) -> dict:
    """The same quantities measured on a run's rows: drafted per round, E[N], seconds per round."""
    sp = rounds[rounds["gamma"] > 0]
    return {
        "drafted": float(sp["drafted"].mean()),
        "accept_length": float((sp["accepted"] + 1).mean()),
        "t_round": float(sp.drop_duplicates(["round", "t_round"])["t_round"].mean()),
    }

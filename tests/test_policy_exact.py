"""Draft-length policies, exactly: Fraction enumeration of their output distributions (issue 38)."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from specbench.audit.policy_exact import output_distribution, product, restricted
from specbench.decoding.policies import POLICIES

P = (F(1, 2), F(3, 10), F(1, 5))
Q = (F(1, 5), F(1, 2), F(3, 10))
TAU = F(1, 4)  # prunes token 0 (q = 1/5) and nothing else


def _show(dist):
    return "{" + ", ".join(f"{''.join(map(str, k))}: {v}" for k, v in sorted(dist.items())) + "}"


def test_the_three_distributions_of_issue_38(capsys):
    """gamma = 1, first token: prune_naive != p, prune_renormalized = p; gamma = 2, two tokens: confidence_stop = p."""
    assert restricted(Q, TAU) == (0, F(5, 8), F(3, 8))
    one = {name: output_distribution(P, Q, 1, POLICIES.get(name), TAU, 1) for name in POLICIES}
    two = {name: output_distribution(P, Q, 2, POLICIES.get(name), TAU, 2) for name in POLICIES}
    with capsys.disabled():
        print(f"\np = {P}, q = {Q}, tau = {TAU}")
        for name in ("prune_naive", "prune_renormalized", "confidence_stop"):
            print(f"{name:>19}  gamma=1, 1 token: {_show(one[name])}")
            print(f"{'':>19}  gamma=2, 2 tokens: {_show(two[name])}")
    # prune_naive: 1/5 p + 4/5 (3/8, 3/8, 1/4): the kept draft is a draw from q' but verified with q.
    assert one["prune_naive"] == {(0,): F(2, 5), (1,): F(9, 25), (2,): F(6, 25)}
    assert two["prune_naive"] != product(P, 2)
    for name in ("prune_renormalized", "confidence_stop", "fixed", "schedule"):
        assert one[name] == product(P, 1), name
        assert two[name] == product(P, 2), name


@pytest.mark.parametrize("tau", [F(1, 4), F(7, 20), F(1, 2), F(3, 5)])
@pytest.mark.parametrize("name", ["fixed", "confidence_stop", "schedule", "prune_renormalized", "prune_naive"])
def test_every_policy_over_three_tokens(name, tau):
    """gamma = 3 over 3 tokens (several rounds, the schedule changing gamma between them): lossless ones = p^3."""
    policy = POLICIES.get(name)
    dist = output_distribution(P, Q, 3, policy, tau, 3)
    assert sum(dist.values()) == 1
    # (tau = 3/5 drops every draft: plain sampling from p, whatever the q the rule would have seen)
    prunes_some = any(x < tau for x in Q) and any(x >= tau for x in Q)
    assert (dist == product(P, 3)) == (policy.lossless or not prunes_some)

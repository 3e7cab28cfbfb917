"""Exact output distributions of speculative sampling under a draft-length policy, in Fractions.

For a context-free pair (the target's p and the draft's q the same at every position) every draw
of a round is enumerated: the drafts x_1..x_gamma (probability prod q(x_i)), the policy's length L
(its own `drop` / `stop_after`, called on Fractions), the q the rule is handed (q, or q restricted to
{q >= tau} renormalized), then min(1, p/q) acceptance with the recovered token from (p - q)+ or the
bonus from p. Rounds follow each other (with the policy's `next_gamma`) until `n_tokens` are out.
A lossless policy gives exactly p x ... x p; anything else is a counterexample, with its numbers.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

from specbench.decoding.policies import DraftPolicy, next_gamma

Dist = tuple[Fraction, ...]


def restricted(q: Dist, tau: Fraction) -> Dist:
    """q restricted to {q >= tau}, renormalized (q itself when nothing is left: no draft is kept then)."""
    kept = [x if x >= tau else Fraction(0) for x in q]
    z = sum(kept)
    return tuple(x / z for x in kept) if z else q


def kept_length(policy: DraftPolicy, q_x: list[Fraction], tau: Fraction) -> int:
    """The policy's drafted length for drafts with probabilities q_x (mirrors `policies.draft_lengths`)."""
    for i, value in enumerate(q_x):
        if policy.drop is not None and policy.drop(value, tau):
            return i
        if policy.stop_after is not None and policy.stop_after(value, tau):
            return i + 1
    return len(q_x)


def _residual(p: Dist, q: Dist) -> Dist:
    r = [max(a - b, Fraction(0)) for a, b in zip(p, q)]
    z = sum(r)
    return tuple(x / z for x in r) if z else p


def round_distribution(
    p: Dist, q: Dist, gamma: int, policy: DraftPolicy, tau: Fraction
) -> dict[tuple[tuple[int, ...], int], Fraction]:
    """(committed tokens, drafted length L) -> probability, for one round that may draft `gamma`."""
    q_rule = restricted(q, tau) if policy.restrict_q else q
    out: dict[tuple[tuple[int, ...], int], Fraction] = {}

    def add(tokens: tuple[int, ...], length: int, prob: Fraction) -> None:
        if prob:
            out[(tokens, length)] = out.get((tokens, length), Fraction(0)) + prob

    for drafts in itertools.product(range(len(q)), repeat=gamma):
        prob = Fraction(1)
        for x in drafts:
            prob *= q[x]
        if not prob:
            continue
        length = kept_length(policy, [q[x] for x in drafts], tau)
        reach = prob  # probability of drawing these drafts and accepting the first k
        for k in range(length + 1):
            if k == length:  # all kept drafts accepted: the bonus from p
                for b, pb in enumerate(p):
                    add(drafts[:k] + (b,), length, reach * pb)
                break
            x = drafts[k]
            accept = min(Fraction(1), p[x] / q_rule[x]) if q_rule[x] else Fraction(int(p[x] > 0))
            for r, pr in enumerate(_residual(p, q_rule)):
                add(drafts[:k] + (r,), length, reach * (1 - accept) * pr)
            reach *= accept
    return out


def output_distribution(
    p: Dist, q: Dist, gamma: int, policy: DraftPolicy, tau: Fraction, n_tokens: int
) -> dict[tuple[int, ...], Fraction]:
    """The exact distribution of the first `n_tokens` committed tokens, over as many rounds as it takes."""
    rounds: dict[int, dict] = {}
    frontier = {((), gamma): Fraction(1)}  # (tokens so far, the row's gamma next round) -> probability
    done: dict[tuple[int, ...], Fraction] = {}
    while frontier:
        (tokens, g), prob = frontier.popitem()
        if g not in rounds:
            rounds[g] = round_distribution(p, q, g, policy, tau)
        for (new, length), pr in rounds[g].items():
            out = (tokens + new)[:n_tokens]
            if len(out) == n_tokens:
                done[out] = done.get(out, Fraction(0)) + prob * pr
            else:
                key = (out, next_gamma(policy, g, gamma, len(new) - 1, length))
                frontier[key] = frontier.get(key, Fraction(0)) + prob * pr
    return done


def product(p: Dist, n_tokens: int) -> dict[tuple[int, ...], Fraction]:
    """p x ... x p over n tokens: what a lossless decoder outputs for a context-free target."""
    out = {}
    for tokens in itertools.product(range(len(p)), repeat=n_tokens):
        prob = Fraction(1)
        for t in tokens:
            prob *= p[t]
        out[tokens] = prob
    return out

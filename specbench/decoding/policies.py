"""Draft-length policies: how many of a round's up to gamma_max drafts are verified, and with which q.

A policy is data, read by pure tensor functions; the decoder never branches on its name. Its parts:

* `drop(q_x, tau)`: drop draft x_i, and every later one (they were drafted after it), when this holds
  of x_i's own probability q(x_i): a decision taken *after* sampling x_i, on x_i;
* `stop_after(q_x, tau)`: keep x_i and draft no more after it;
* `restrict_q`: verify the kept drafts with q restricted to {q >= tau}, renormalized;
* `adapt(gamma, gamma_max, accepted, drafted)`: the row's gamma for its next round (host ints).

`drop` and `stop_after` are comparisons, so the exact enumeration (`specbench.audit.policy_exact`)
calls them on Fractions: the rule it enumerates is this code. Their tensor forms over a batch are in
`specbench.decoding.lengths`. No torch here: configs validate `draft.policy` against this registry.

Which are lossless, and why. The acceptance rule min(1, p/q) with residual (p - q)+ outputs p at a
position exactly when the candidate there was drawn from the q it is handed. Stopping *after* a kept
token (`confidence_stop`) or choosing gamma before drafting (`schedule`) leaves every verified
candidate a draw from q; positions not drafted get the bonus from p. Dropping x_i because q(x_i) < tau
makes the kept candidate a draw from q restricted to {q >= tau}, renormalized (call it q'): verified
with q' (`prune_renormalized`) the position still outputs p (kept: p; dropped: the bonus from p);
verified with the original q (`prune_naive`, the audit's deliberately broken one) it does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specbench.registry import Registry

# Why a row's round drafted what it drafted (the `stop` column of the round rows).
STOP_GAMMA = "gamma"  # no rule cut it: its gamma for the round, or what the draft proposed (n-gram)
STOP_CONFIDENCE = "confidence"  # `stop_after` held at its last kept draft (at its gamma's last one too)
STOP_PRUNED = "pruned"  # `drop` held at the draft after its last kept one
STOP_REASONS = (STOP_GAMMA, STOP_CONFIDENCE, STOP_PRUNED)


@dataclass(frozen=True)
class DraftPolicy:
    lossless: bool = True
    drop: Callable | None = None  # (q_x, tau) -> bool
    stop_after: Callable | None = None  # (q_x, tau) -> bool
    restrict_q: bool = False
    adapt: Callable[[int, int, int, int], int] | None = None  # (gamma, gamma_max, accepted, drafted) -> gamma

    @property
    def reads_confidence(self) -> bool:
        """Whether its lengths depend on the drawn drafts (then the host learns them with a sync)."""
        return self.drop is not None or self.stop_after is not None


def _below(q_x, tau):
    return q_x < tau


def _transformers_schedule(gamma: int, gamma_max: int, accepted: int, drafted: int) -> int:
    """transformers' `num_assistant_tokens_schedule="heuristic"`: +2 after a full accept, -1 otherwise."""
    return min(gamma + 2, gamma_max) if accepted == drafted else max(gamma - 1, 1)


POLICIES: Registry[DraftPolicy] = Registry("draft.policy")
FIXED = POLICIES.register("fixed", DraftPolicy())
POLICIES.register("confidence_stop", DraftPolicy(stop_after=_below))
POLICIES.register("schedule", DraftPolicy(adapt=_transformers_schedule))
POLICIES.register("prune_renormalized", DraftPolicy(drop=_below, restrict_q=True))
POLICIES.register("prune_naive", DraftPolicy(lossless=False, drop=_below))  # audit only: breaks losslessness


def next_gamma(policy: DraftPolicy, gamma: int, gamma_max: int, accepted: int, drafted: int) -> int:
    """A row's gamma for its next round (host ints; gamma_max for a policy without a schedule)."""
    return gamma_max if policy.adapt is None else policy.adapt(gamma, gamma_max, accepted, drafted)

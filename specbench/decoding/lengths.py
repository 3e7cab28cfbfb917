"""A draft-length policy over a batch, as pure tensor functions: the draft's confidence, each row's kept
length and why, and the q the acceptance rule is handed (see `specbench.decoding.policies`)."""

from __future__ import annotations

import torch

from specbench.decoding.policies import DraftPolicy


def confidence(drafts: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """drafts [B, G], q [B, G, V] -> q(x_i) [B, G] and max_v q_i(v) [B, G]: the draft's confidence."""
    return q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1), q.amax(-1)


def draft_lengths(
    policy: DraftPolicy,
    q_x: torch.Tensor | None,  # [B, G] q(x_i); None when q was not built (then no rule reads it)
    tau: float,
    row_gamma: torch.Tensor,  # [B] long, each row's gamma this round (<= G)
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> drafts kept per row [B] long (0..row_gamma) and the stop reason [B] long (index into STOP_REASONS)."""
    length, reason = row_gamma.clone(), torch.zeros_like(row_gamma)
    if q_x is None:
        return length, reason
    pos = torch.arange(q_x.shape[1], device=q_x.device)[None]  # [1, G]
    big = torch.full_like(q_x, q_x.shape[1] + 1, dtype=torch.long)
    for rule, cut, code in ((policy.stop_after, pos + 1, 1), (policy.drop, pos, 2)):
        if rule is None:
            continue
        at = torch.where(rule(q_x, tau), cut.expand_as(big), big).amin(-1)  # [B] first cut, G + 1 if none
        reason = torch.where(at <= length, torch.full_like(reason, code), reason)  # the rule cut here (too)
        length = torch.minimum(length, at)
    return length, reason


def verify_q(policy: DraftPolicy, q: torch.Tensor, tau: float) -> torch.Tensor:
    """The q [B, G, V] the acceptance rule is handed: q, or q restricted to {q >= tau} renormalized
    (a position whose every q < tau keeps q: its draft was dropped, the rule never reads it)."""
    if not policy.restrict_q:
        return q
    kept = torch.where(q >= tau, q, torch.zeros_like(q))
    z = kept.sum(-1, keepdim=True)
    return torch.where(z > 0, kept / z.clamp_min(torch.finfo(q.dtype).tiny), q)


def done_rule(policy: DraftPolicy, tau: float):
    """`Draft.propose`'s `done(token [B], q [B, V]) -> [B] bool` for a policy that cuts on the draws (a row
    drafts no more after a draft its `stop_after` or `drop` holds for); None for one that does not."""
    rules = [rule for rule in (policy.stop_after, policy.drop) if rule is not None]
    if not rules:
        return None

    def done(token: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        q_x = q.gather(-1, token[:, None]).squeeze(-1)  # [B]
        out = rules[0](q_x, tau)
        for rule in rules[1:]:
            out = out | rule(q_x, tau)
        return out

    return done

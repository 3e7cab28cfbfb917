"""Deliberately broken speculative decoders: what the lossless audit must catch.

Each variant changes exactly one thing in the correct algorithm (`acceptance.rejection_sample`
with `drafts.ModelDraft`), the kind of slip a real implementation makes:

* `p_not_residual`: at the first rejection the recovered token is sampled from p, not (p - q)+;
* `raw_q`: drafts are sampled from the processed q, but the q handed to the acceptance test
  is softmax(raw logits): temperature / top-k / top-p are not folded into it;
* `keep_after_reject`: `accepted` counts every passed position, not only the leading run,
  so a rejected draft is committed whenever a later one passed;
* `bonus_wrong_position`: the bonus token (all gamma accepted) is drawn from p[gamma - 1]
  instead of p[gamma];
* `penalty_committed_only`: the context processors (penalties, banned sequences) see only
  the committed tokens at every position of a round, ignoring the drafts before the position
  (in p and q alike: the per-round shortcut of computing the penalties once).

The rules have `rejection_sample`'s signature and plug into
`speculative_decode(..., rule=...)`; `raw_q` is a draft (`RawLogitsQDraft`) and
`penalty_committed_only` a context (`CommittedOnlyContext`, `speculative_decode(...,
context_class=...)`). Used by the audit's tests and by
`python -m specbench.audit --decoder broken:<name>`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specbench.decoding.acceptance import Acceptance, acceptance_probability, rejection_sample, residual
from specbench.decoding.drafts import Draft, ModelDraft
from specbench.decoding.sampling import TokenContext, sample


def _passed(draft_tokens, q, p, generator, uniforms) -> torch.Tensor:
    batch, gamma = draft_tokens.shape
    if uniforms is None:
        uniforms = torch.rand(batch, gamma, device=p.device, dtype=p.dtype, generator=generator)
    p_x = p[:, :gamma].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    q_x = q.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    return uniforms < acceptance_probability(p_x, q_x)  # [B, gamma]


def _extra(p: torch.Tensor, q: torch.Tensor, accepted: torch.Tensor, generator) -> torch.Tensor:
    """The correct extra token: residual at `accepted`, or p[gamma] when all were accepted."""
    batch = p.shape[0]
    q_padded = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)
    index = accepted.view(batch, 1, 1).expand(batch, 1, p.shape[-1])
    p_at = p.gather(1, index).squeeze(1)
    q_at = q_padded.gather(1, index).squeeze(1)
    return torch.multinomial(residual(p_at, q_at), 1, generator=generator).squeeze(-1)


def p_not_residual_rule(draft_tokens, q, p, generator=None, uniforms=None) -> Acceptance:
    """BROKEN (a): the recovered token is drawn from p at the rejected position, not from (p - q)+."""
    gamma = draft_tokens.shape[1]
    accepted = _passed(draft_tokens, q, p, generator, uniforms).long().cumprod(-1).sum(-1)
    p_at = p.gather(1, accepted.view(-1, 1, 1).expand(-1, 1, p.shape[-1])).squeeze(1)
    extra = torch.multinomial(p_at, 1, generator=generator).squeeze(-1)
    return Acceptance(accepted=accepted, extra_token=extra, is_bonus=accepted == gamma)


def keep_after_reject_rule(draft_tokens, q, p, generator=None, uniforms=None) -> Acceptance:
    """BROKEN (c): `accepted` = number of passed positions anywhere, so the decoder commits the
    first `accepted` drafts even when one of them was rejected and a later one passed."""
    gamma = draft_tokens.shape[1]
    accepted = _passed(draft_tokens, q, p, generator, uniforms).long().sum(-1)
    extra = _extra(p, q, accepted, generator)
    return Acceptance(accepted=accepted, extra_token=extra, is_bonus=accepted == gamma)


def bonus_wrong_position_rule(draft_tokens, q, p, generator=None, uniforms=None) -> Acceptance:
    """BROKEN (d): when all gamma drafts pass, the bonus is drawn from p[gamma - 1] (the last
    draft's own position) instead of p[gamma] (the position after it)."""
    gamma = draft_tokens.shape[1]
    accepted = _passed(draft_tokens, q, p, generator, uniforms).long().cumprod(-1).sum(-1)
    extra = _extra(p, q, accepted, generator)
    wrong = sample(p[:, gamma - 1], generator)
    is_bonus = accepted == gamma
    return Acceptance(accepted=accepted, extra_token=torch.where(is_bonus, wrong, extra), is_bonus=is_bonus)


class RawLogitsQDraft(ModelDraft):
    """BROKEN (b): drafts are sampled from the processed q, but the returned q is softmax of the
    raw logits, so temperature / top-k / top-p are not folded into the acceptance test."""

    def reported_q(self, q: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().softmax(-1)  # the bug: the unprocessed distribution


class CommittedOnlyContext(TokenContext):
    """BROKEN (e): every position of a round gets the committed context: the drafts earlier in the
    round are not added, neither for q (`append`) nor for p (`expand`)."""

    def append(self, tokens: torch.Tensor) -> TokenContext:
        return self

    def expand(self, drafts: torch.Tensor) -> TokenContext:
        positions = drafts.shape[1] + 1
        per_position = [
            None if t is None else t[:, None].expand(-1, positions, t.shape[-1])
            for t in (self.seen, self.counts, self.tail)
        ]
        return TokenContext(*per_position)  # [B, gamma + 1, ...], the same at every position


@dataclass(frozen=True)
class Variant:
    """A speculative decoder built from `speculative_decode` with one part swapped."""

    name: str
    description: str
    rule: Callable[..., Acceptance] = rejection_sample
    draft_class: type = ModelDraft
    context_class: type[TokenContext] = TokenContext

    def new_draft(self, draft_model) -> Draft:
        return self.draft_class(draft_model, name=f"broken:{self.name}")


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(
            "p_not_residual", "recovered token sampled from p, not from the residual (p - q)+", rule=p_not_residual_rule
        ),
        Variant(
            "raw_q",
            "q = softmax(raw draft logits): temperature/top-k/top-p not folded into q",
            draft_class=RawLogitsQDraft,
        ),
        Variant(
            "keep_after_reject",
            "drafts after the first rejection are kept (accepted = all passed positions)",
            rule=keep_after_reject_rule,
        ),
        Variant(
            "bonus_wrong_position",
            "bonus token drawn from p[gamma-1] instead of p[gamma]",
            rule=bonus_wrong_position_rule,
        ),
        Variant(
            "penalty_committed_only",
            "penalties / banned sequences see only the committed tokens, not the drafts earlier in the round",
            context_class=CommittedOnlyContext,
        ),
    )
}


def get_variant(name: str) -> Variant:
    """The broken variant called `name` (a ValueError listing the names otherwise)."""
    if name not in VARIANTS:
        raise ValueError(f"broken variant {name!r}: must be one of {list(VARIANTS)}")
    return VARIANTS[name]

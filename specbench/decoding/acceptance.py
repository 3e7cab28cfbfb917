"""The acceptance rule of speculative sampling, as a pure batched tensor function.

No model, cache or clock in here: given drafted tokens, their processed draft
distribution q and the target's processed distribution p, decide how many drafts
are accepted and produce the one extra token (recovered or bonus). Under greedy
`process_logits` makes p one-hot, and then the rule accepts iff the draft equals argmax p
and recovers argmax p, whatever q: `greedy_accept` is that outcome computed from argmax p
alone (vLLM's greedy path), which the decoder takes through `GREEDY_FORMS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specbench.decoding.sampling import sample


@dataclass
class Acceptance:
    accepted: torch.Tensor  # [B] long, number of leading drafts accepted (0..gamma)
    extra_token: torch.Tensor  # [B] long, recovered token (accepted < gamma) or bonus token
    is_bonus: torch.Tensor  # [B] bool, True when all gamma drafts were accepted


def acceptance_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x)/q(x)) elementwise; q(x) = 0 (never drafted by sampling) accepts iff p(x) > 0."""
    ratio = p_x / q_x.clamp_min(torch.finfo(q_x.dtype).tiny)
    return torch.where(q_x > 0, ratio.clamp(max=1.0), (p_x > 0).to(p_x.dtype))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(p - q)+ normalised over the last dim; falls back to p where p <= q everywhere.

    The fallback is only reachable where rejection had probability zero (p = q), so
    it never changes the output distribution; it just keeps the result NaN-free.
    """
    r = (p - q).clamp_min(0.0)
    z = r.sum(-1, keepdim=True)
    return torch.where(z > 0, r / z.clamp_min(torch.finfo(r.dtype).tiny), p)


def rejection_sample(
    draft_tokens: torch.Tensor,  # [B, gamma] long
    q: torch.Tensor,  # [B, gamma, V] processed draft distribution at each drafted position
    p: torch.Tensor,  # [B, gamma + 1, V] processed target distribution (last = bonus position)
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,  # [B, gamma] in [0, 1); drawn from generator if None
    lengths: torch.Tensor | None = None,  # [B] long, drafts row b verifies (a draft-length policy); None: gamma
) -> Acceptance:
    """Accept draft i with probability min(1, p/q) until the first rejection; then sample
    the recovered token from (p - q)+ there, or the bonus token from p[gamma] if none failed.
    With `lengths`, row b's drafts past lengths[b] are not candidates: its bonus is p[lengths[b]]."""
    batch, gamma = draft_tokens.shape
    if uniforms is None:
        uniforms = torch.rand(batch, gamma, device=p.device, dtype=p.dtype, generator=generator)
    p_x = p[:, :gamma].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, gamma]
    q_x = q.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, gamma]
    passed = uniforms < acceptance_probability(p_x, q_x)  # [B, gamma]
    if lengths is not None:
        live = _live(lengths, gamma)  # [B, gamma]
        passed, q = passed & live, q * live.unsqueeze(-1)  # a zero q row past the length: the residual is p
    accepted = passed.long().cumprod(-1).sum(-1)  # [B] leading passes only

    # A zero q row at position gamma turns the residual there into p[gamma], so the
    # recovered and the bonus token come from one gather and one draw.
    q_padded = torch.cat([q, q.new_zeros(batch, 1, q.shape[-1])], dim=1)  # [B, gamma + 1, V] (gamma may be 0)
    index = accepted.view(batch, 1, 1).expand(batch, 1, p.shape[-1])
    p_at = p.gather(1, index).squeeze(1)  # [B, V]
    q_at = q_padded.gather(1, index).squeeze(1)  # [B, V]
    extra = sample(residual(p_at, q_at), generator)  # [B] (no host sync on CUDA, see `sample`)
    return Acceptance(accepted=accepted, extra_token=extra, is_bonus=accepted == _ends(lengths, gamma))


def _live(lengths: torch.Tensor, gamma: int) -> torch.Tensor:
    """[B] lengths -> [B, gamma] bool: which drafted positions each row verifies."""
    return torch.arange(gamma, device=lengths.device)[None] < lengths[:, None]


def _ends(lengths: torch.Tensor | None, gamma: int) -> torch.Tensor | int:
    return gamma if lengths is None else lengths


def greedy_accept(
    draft_tokens: torch.Tensor, target_tokens: torch.Tensor, lengths: torch.Tensor | None = None
) -> Acceptance:
    """`rejection_sample`'s outcome when p is one-hot at target_tokens [B, gamma + 1] (greedy), for any q.

    p(x) is 1 or 0, so min(1, p/q) passes every uniform or none: accept while the draft is the target's
    argmax; the residual (p - q)+ is then one-hot at that argmax, which is the recovered token (or, past
    gamma, the bonus). The same tokens without building p [B, gamma + 1, V] or drawing a uniform, which
    was most of a greedy round's C_o on CPU (analysis/fast_path_greedy_co_cpu_amx/).
    """
    gamma = draft_tokens.shape[1]
    same = draft_tokens == target_tokens[:, :gamma]  # [B, gamma]
    if lengths is not None:
        same = same & _live(lengths, gamma)
    accepted = same.long().cumprod(-1).sum(-1)  # [B]
    extra = target_tokens.gather(1, accepted[:, None]).squeeze(1)  # [B]
    return Acceptance(accepted=accepted, extra_token=extra, is_bonus=accepted == _ends(lengths, gamma))


# A rule -> its form under greedy, given the target's argmax tokens; a rule not listed (the audit's
# deliberately broken ones) runs on the processed distributions under greedy too.
GREEDY_FORMS: dict[Callable[..., Acceptance], Callable[[torch.Tensor, torch.Tensor], Acceptance]] = {
    rejection_sample: greedy_accept
}

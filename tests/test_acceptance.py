"""The acceptance rule: exact enumeration, statistical convergence, edge cases."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest
import torch
from scipy import stats

from specbench.decoding.acceptance import (
    GREEDY_FORMS,
    acceptance_probability,
    greedy_accept,
    rejection_sample,
    residual,
)
from specbench.decoding.sampling import SamplingConfig, process_logits

# ---------------------------------------------------------------- exact (Fractions)


def output_distribution(p: list[F], q: list[F], resample_from_p: bool = False) -> list[F]:
    """Exact output law of one speculative position: draw x ~ q, accept w.p. min(1, p/q),
    else draw from the residual (p - q)+ / Z (or, wrongly, from p)."""
    v = len(p)
    res = [max(pi - qi, F(0)) for pi, qi in zip(p, q)]
    z = sum(res)
    res = [r / z for r in res] if z > 0 else list(p)
    on_reject = list(p) if resample_from_p else res
    out = [F(0)] * v
    for x in range(v):
        if q[x] == 0:
            continue
        accept = min(F(1), p[x] / q[x])
        out[x] += q[x] * accept
        for y in range(v):
            out[y] += q[x] * (1 - accept) * on_reject[y]
    return out


PAIRS = {
    "p=q": ([F(1, 2), F(1, 3), F(1, 6)], [F(1, 2), F(1, 3), F(1, 6)]),
    "generic": ([F(1, 2), F(1, 4), F(1, 8), F(1, 8)], [F(1, 10), F(2, 5), F(1, 5), F(3, 10)]),
    "q(x)=0<p(x)": ([F(1, 3), F(1, 3), F(1, 3)], [F(1, 2), F(1, 2), F(0)]),
    "disjoint": ([F(0), F(0), F(1, 4), F(3, 4)], [F(2, 3), F(1, 3), F(0), F(0)]),
    "one-hot q": ([F(1, 5), F(3, 5), F(1, 5)], [F(0), F(0), F(1)]),
    "top-k zeros in p": ([F(0), F(1, 2), F(1, 2), F(0)], [F(1, 4), F(1, 4), F(1, 4), F(1, 4)]),
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_exact_enumeration_returns_p(name):
    p, q = PAIRS[name]
    assert output_distribution(p, q) == p


@pytest.mark.parametrize(
    "name", ["generic", "q(x)=0<p(x)", "one-hot q"]
)  # disjoint: every draft is rejected, so both rules give p
def test_exact_enumeration_tells_the_wrong_rule_apart(name):
    p, q = PAIRS[name]
    assert output_distribution(p, q, resample_from_p=True) != p


@pytest.mark.parametrize("name", list(PAIRS))
def test_tensor_helpers_match_the_exact_law(name):
    """The module's own acceptance_probability and residual, enumerated in float64."""
    p_f, q_f = PAIRS[name]
    p = torch.tensor([float(x) for x in p_f], dtype=torch.float64)
    q = torch.tensor([float(x) for x in q_f], dtype=torch.float64)
    accept = acceptance_probability(p, q)
    out = (q * accept) + (q * (1 - accept)).sum() * residual(p, q)
    assert torch.allclose(out, p, atol=1e-12)
    assert torch.isfinite(out).all()


# ------------------------------------------------------------- the batched function


def test_uniforms_decide_exactly_at_the_threshold():
    # p(x)/q(x) = 0.5 at position 0: u = 0.49 accepts, u = 0.51 rejects.
    p = torch.tensor([[[0.25, 0.75], [0.5, 0.5], [1.0, 0.0]]])
    q = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]])
    drafts = torch.tensor([[0, 1]])
    assert rejection_sample(drafts, q, p, uniforms=torch.tensor([[0.49, 0.3]])).accepted.item() == 2
    rejected = rejection_sample(drafts, q, p, uniforms=torch.tensor([[0.51, 0.3]]))
    assert rejected.accepted.item() == 0
    assert rejected.extra_token.item() == 1  # residual (p - q)+ at position 0 is all on token 1
    assert not rejected.is_bonus.item()


def test_bonus_token_comes_from_the_last_position():
    p = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]])
    q = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
    out = rejection_sample(torch.tensor([[1, 2]]), q, p, generator=torch.Generator().manual_seed(0))
    assert out.accepted.item() == 2 and out.is_bonus.item() and out.extra_token.item() == 0


def test_greedy_accepts_iff_argmax_and_recovers_argmax():
    logits = torch.tensor([[[0.1, 2.0, 0.3], [3.0, 0.0, 0.1], [0.0, 0.0, 5.0]]])
    p = process_logits(logits, SamplingConfig(temperature=0))
    q = process_logits(torch.tensor([[[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]]), SamplingConfig(temperature=0))
    out = rejection_sample(torch.tensor([[1, 1]]), q, p, generator=torch.Generator().manual_seed(0))
    assert out.accepted.item() == 1 and out.extra_token.item() == 0


@pytest.mark.parametrize("q_kind", ["one-hot at the draft", "one-hot elsewhere", "full support", "zero at the draft"])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_form_equals_the_rule_on_one_hot_p_for_any_q(q_kind, gamma):
    """`greedy_accept` from argmax p gives exactly `rejection_sample`'s accepted/extra/bonus whenever p is one-hot."""
    g = torch.Generator().manual_seed(gamma)
    batch, vocab = 256, 5
    target = torch.randint(0, vocab, (batch, gamma + 1), generator=g)
    # drafts that match the target's argmax most of the time, so every accepted count occurs
    drafts = torch.where(
        torch.rand(batch, gamma, generator=g) < 0.8,
        target[:, :gamma],
        torch.randint(0, vocab, (batch, gamma), generator=g),
    )
    p = torch.nn.functional.one_hot(target, vocab).double()
    if q_kind == "full support":
        q = torch.rand(batch, gamma, vocab, generator=g, dtype=torch.double) + 0.01
    else:
        at = drafts if q_kind != "one-hot elsewhere" else (drafts + 1) % vocab
        q = torch.nn.functional.one_hot(at, vocab).double()
        if q_kind == "zero at the draft":
            q = torch.nn.functional.one_hot((drafts + 2) % vocab, vocab).double() * 0.5 + q * 0 + 0.5 / vocab
            q.scatter_(-1, drafts[..., None], 0.0)
    q = q / q.sum(-1, keepdim=True)
    general = rejection_sample(drafts, q, p, generator=torch.Generator().manual_seed(0))
    greedy = greedy_accept(drafts, target)
    assert torch.equal(greedy.accepted, general.accepted)
    assert torch.equal(greedy.extra_token, general.extra_token)
    assert torch.equal(greedy.is_bonus, general.is_bonus)
    assert set(greedy.accepted.tolist()) == set(range(gamma + 1))  # every outcome was exercised
    assert GREEDY_FORMS[rejection_sample] is greedy_accept


def test_rows_are_ragged_and_independent():
    p = torch.tensor([[[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]])
    q = torch.tensor([[[0.0, 1.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]])
    out = rejection_sample(torch.tensor([[1, 1], [1, 1]]), q, p, generator=torch.Generator().manual_seed(0))
    assert out.accepted.tolist() == [2, 0]
    assert out.extra_token.tolist() == [0, 0]
    assert out.is_bonus.tolist() == [True, False]


@pytest.mark.parametrize("case", ["p=q", "disjoint", "q zero where p positive", "one-hot both"])
def test_no_nan_on_degenerate_inputs(case):
    v = 5
    p = torch.full((3, 3, v), 1.0 / v)
    q = torch.full((3, 2, v), 1.0 / v)
    if case == "disjoint":
        p = torch.zeros(3, 3, v)
        p[..., :2] = 0.5
        q = torch.zeros(3, 2, v)
        q[..., 2:] = 1.0 / 3
    elif case == "q zero where p positive":
        q = torch.zeros(3, 2, v)
        q[..., 0] = 1.0
    elif case == "one-hot both":
        p = torch.zeros(3, 3, v)
        p[..., 1] = 1.0
        q = torch.zeros(3, 2, v)
        q[..., 1] = 1.0
    drafts = torch.multinomial(q.reshape(-1, v), 1).reshape(3, 2)
    out = rejection_sample(drafts, q, p, generator=torch.Generator().manual_seed(0))
    assert ((out.accepted >= 0) & (out.accepted <= 2)).all()
    assert ((out.extra_token >= 0) & (out.extra_token < v)).all()
    assert p[0, 0, out.extra_token].gt(0).all()  # never a token the target forbids
    if case == "disjoint":
        assert out.accepted.eq(0).all()
    if case in ("p=q", "one-hot both"):
        assert out.accepted.eq(2).all()


# ------------------------------------------------------------- statistical convergence


def _first_token_law(p, q, n, seed, broken=False):
    """Empirical law of the first committed token over n independent rounds (gamma = 3)."""
    g = torch.Generator().manual_seed(seed)
    batch, gamma, v = n, q.shape[0], q.shape[-1]
    pb, qb = p.expand(batch, -1, -1), q.expand(batch, -1, -1)
    drafts = torch.multinomial(qb.reshape(-1, v), 1, generator=g).reshape(batch, gamma)
    if broken:  # resample from p on rejection instead of the residual
        out = rejection_sample(drafts, qb, pb, generator=g)
        first = torch.where(out.accepted > 0, drafts[:, 0], torch.multinomial(pb[:, 0], 1, generator=g).squeeze(-1))
    else:
        out = rejection_sample(drafts, qb, pb, generator=g)
        first = torch.where(out.accepted > 0, drafts[:, 0], out.extra_token)
    return torch.bincount(first, minlength=v).double() / batch


def _second_token_law(p, q, n, seed):
    """Law of the second committed token given the first was accepted: must be p[1]."""
    g = torch.Generator().manual_seed(seed)
    v = q.shape[-1]
    # Condition on draft 1 = token 0 (p(0|prefix) > 0) so p[1] is the right target law.
    drafts2 = torch.multinomial(q[1:2].expand(n, -1), 1, generator=g).squeeze(-1)
    drafts = torch.stack([torch.zeros(n, dtype=torch.long), drafts2, torch.zeros(n, dtype=torch.long)], 1)
    pb = p.expand(n, -1, -1).clone()
    pb[:, 0] = 0
    pb[:, 0, 0] = 1.0  # draft 1 always accepted
    out = rejection_sample(drafts, q.expand(n, -1, -1), pb, generator=g)
    second = torch.where(out.accepted > 1, drafts[:, 1], out.extra_token)
    return torch.bincount(second, minlength=v).double() / n


def test_batched_rule_converges_to_p_and_the_broken_rule_does_not():
    torch.manual_seed(0)
    v, gamma = 6, 3
    p = torch.softmax(torch.randn(gamma + 1, v) * 1.5, -1)
    q = torch.softmax(torch.randn(gamma, v) * 1.5, -1)
    sizes = [2_000, 32_000, 512_000]
    tv = [0.5 * (_first_token_law(p, q, n, seed=n) - p[0]).abs().sum().item() for n in sizes]
    tv_broken = [0.5 * (_first_token_law(p, q, n, seed=n, broken=True) - p[0]).abs().sum().item() for n in sizes]
    # Sampling error shrinks like 1/sqrt(n): 256x the samples -> ~16x smaller distance.
    assert tv[-1] < tv[0] / 4
    assert tv[-1] < 0.01
    # The broken rule converges to the wrong law: its distance stays put.
    assert min(tv_broken) > 0.05
    assert tv_broken[-1] > 10 * tv[-1]
    tv2 = 0.5 * (_second_token_law(p, q, 200_000, seed=3) - p[1]).abs().sum().item()
    assert tv2 < 0.01


def test_chi_square_accepts_the_rule_on_every_position():
    """Goodness of fit of the committed token at each position, conditioned on reaching it."""
    torch.manual_seed(1)
    v, gamma, n = 5, 3, 200_000
    p = torch.softmax(torch.randn(gamma + 1, v), -1)
    q = torch.softmax(torch.randn(gamma, v), -1)
    counts = _first_token_law(p, q, n, seed=11) * n
    expected = (p[0].double() / p[0].double().sum() * n).numpy()
    assert stats.chisquare(counts.numpy(), f_exp=expected).pvalue > 1e-4
    broken = _first_token_law(p, q, n, seed=11, broken=True) * n
    assert stats.chisquare(broken.numpy(), f_exp=expected).pvalue < 1e-6
    assert np.isclose(counts.sum().item(), n)

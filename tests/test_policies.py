"""Draft-length policies in the decoder: registry, lengths, ragged verification, cache invariant, round rows."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, hf_greedy

from specbench.decoding.acceptance import greedy_accept, rejection_sample
from specbench.decoding.decoder import speculative_decode
from specbench.decoding.drafts import ModelDraft, NgramDraft
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.lengths import draft_lengths, verify_q
from specbench.decoding.policies import POLICIES, STOP_REASONS
from specbench.decoding.sampling import SamplingConfig

GREEDY = SamplingConfig()
T1 = SamplingConfig(temperature=1.0)


def test_unknown_policy_names_field_value_and_choices():
    with pytest.raises(ValueError, match=r"draft.policy='stop'.*confidence_stop"):
        POLICIES.get("stop", "draft.policy")


def test_draft_lengths_cut_where_each_policy_says():
    q_x = torch.tensor([[0.9, 0.2, 0.8], [0.1, 0.9, 0.9], [0.9, 0.9, 0.9]])
    gammas = torch.tensor([3, 3, 2])
    stop, reason = draft_lengths(POLICIES.get("confidence_stop"), q_x, 0.5, gammas)
    assert stop.tolist() == [2, 1, 2] and [STOP_REASONS[r] for r in reason] == ["confidence", "confidence", "gamma"]
    drop, reason = draft_lengths(POLICIES.get("prune_naive"), q_x, 0.5, gammas)
    assert drop.tolist() == [1, 0, 2] and [STOP_REASONS[r] for r in reason] == ["pruned", "pruned", "gamma"]
    assert draft_lengths(POLICIES.get("fixed"), q_x, 0.5, gammas)[0].tolist() == [3, 3, 2]


def test_verify_q_restricts_and_renormalizes():
    q = torch.tensor([[[0.2, 0.5, 0.3]]], dtype=torch.float64)
    torch.testing.assert_close(
        verify_q(POLICIES.get("prune_renormalized"), q, 0.25), torch.tensor([[[0, 5 / 8, 3 / 8]]]).double()
    )
    assert verify_q(POLICIES.get("prune_naive"), q, 0.25) is q


def test_lengths_mask_equals_the_rule_on_each_row_cut_to_its_length():
    """One batched call with per-row lengths = each row alone, truncated, with the same uniforms."""
    g = torch.Generator().manual_seed(3)
    batch, gamma, vocab = 6, 4, 5
    q = torch.softmax(torch.randn(batch, gamma, vocab, generator=g, dtype=torch.float64), -1)
    p = torch.softmax(torch.randn(batch, gamma + 1, vocab, generator=g, dtype=torch.float64), -1)
    drafts = torch.randint(vocab, (batch, gamma), generator=g)
    uniforms = torch.rand(batch, gamma, generator=g, dtype=torch.float64)
    lengths = torch.tensor([0, 1, 2, 3, 4, 2])
    for seed in range(20):
        both = rejection_sample(drafts, q, p, torch.Generator().manual_seed(seed), uniforms, lengths=lengths)
        for b in range(batch):
            n = int(lengths[b])
            one = rejection_sample(
                drafts[b : b + 1, :n], q[b : b + 1, :n], p[b : b + 1, : n + 1], None, uniforms[b : b + 1, :n]
            )
            assert int(both.accepted[b]) == int(one.accepted[0]) and bool(both.is_bonus[b]) == bool(one.is_bonus[0])
            if both.is_bonus[b] or one.accepted[0] < n:  # the extra token's law: residual at a, or p[n]
                assert p[b, n if both.is_bonus[b] else int(one.accepted[0]), int(both.extra_token[b])] > 0
    target = torch.randint(vocab, (batch, gamma + 1), generator=g)
    target[:, :gamma] = drafts  # every draft right: each row accepts exactly its length
    out = greedy_accept(drafts, target, lengths)
    assert (
        out.accepted.tolist() == lengths.tolist()
        and out.extra_token.tolist() == target.gather(1, lengths[:, None]).squeeze(1).tolist()
    )


@pytest.mark.parametrize("name", ["fixed", "confidence_stop", "schedule", "prune_renormalized", "prune_naive"])
def test_greedy_equals_target_with_every_policy(name, target, close_draft, prompts):
    """Under greedy every policy is lossless (the rule reads argmax p alone); the schedule makes rows ragged."""
    result = speculative_decode(
        CachedLM(target), ModelDraft(close_draft), prompts, 5, GREEDY, 24, set(), policy=POLICIES.get(name), tau=0.5
    )
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == hf_greedy(target, prompt, 24), f"row {row}"
    if name == "schedule":
        per_round = {}
        for r in result.rounds:
            per_round.setdefault(r.round, set()).add(r.drafted)
        assert any(len(v) > 1 for v in per_round.values()), "expected rows of one round to draft different lengths"


def _fresh_keys(model, tokens):
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([tokens]), cache=cache, use_cache=True)
    return cache.layers[0].keys[0]


@pytest.mark.parametrize("name,tau", [("confidence_stop", 0.3), ("prune_renormalized", 0.05), ("schedule", 0.0)])
def test_cache_invariant_and_round_rows_with_ragged_lengths(name, tau, target, close_draft, prompts):
    """T = 1, four rows drafting different lengths: after every round each cache holds exactly the committed
    tokens of its row; the round rows record the policy's decisions and the draft's confidence."""
    target_lm, draft = CachedLM(target), ModelDraft(close_draft)
    checked = []

    def check(seqs, rows):
        for i, seq in enumerate(seqs):
            if seq[-1] == 5 or len(seq) - len(prompts[rows[i]]) >= 20:
                continue  # finished this round (EOS / max_new_tokens cut its commit): dropped from the caches next
            k, _ = target_lm.row_kv(i, 0)
            torch.testing.assert_close(k, _fresh_keys(target, seq[:-1]), rtol=1e-9, atol=1e-9)
            dk, _ = draft.lm.row_kv(i, 0)
            assert len(seq) - 2 <= dk.shape[1] <= len(seq) - 1
            torch.testing.assert_close(dk, _fresh_keys(close_draft, seq[: dk.shape[1]]), rtol=1e-9, atol=1e-9)
        checked.append(len(seqs))

    g = torch.Generator().manual_seed(1)
    result = speculative_decode(
        target_lm, draft, prompts, 4, T1, 20, {5}, g, on_round=check, policy=POLICIES.get(name), tau=tau
    )
    assert len(checked) >= 5
    rows = result.rounds
    assert len({(r.round, r.drafted) for r in rows}) > len({r.round for r in rows}), "no ragged round"
    for r in rows:
        assert 0 <= r.accepted <= r.drafted <= r.gamma <= 4 and r.stop in STOP_REASONS
        assert r.extra == ("bonus" if r.accepted == r.drafted else "recovered")
        # the draft stops once every row's policy stopped: confidences of what it drafted (dropped ones included)
        assert r.drafted <= len(r.q_drafted) == len(r.q_max) <= r.gamma
        assert all(0 < a <= m <= 1 for a, m in zip(r.q_drafted, r.q_max))
        if r.stop == "confidence":
            assert r.q_drafted[r.drafted - 1] < tau
        if r.stop == "pruned":
            assert r.q_drafted[r.drafted] < tau and all(x >= tau for x in r.q_drafted[: r.drafted])
    assert {r.stop for r in rows} - {"gamma"} or name == "schedule"


def test_config_names_field_value_and_choices():
    from specbench.config.components import DraftConfig

    with pytest.raises(ValueError, match=r"draft.policy='stop': must be one of \['fixed', 'confidence_stop'"):
        DraftConfig(policy="stop")
    with pytest.raises(ValueError, match=r"draft.policy='prune_naive': not lossless, for the audit only"):
        DraftConfig(policy="prune_naive")
    with pytest.raises(ValueError, match=r"draft.tau=1.5: must be a probability"):
        DraftConfig(policy="confidence_stop", tau=1.5)
    assert DraftConfig(policy="confidence_stop", tau=0.3).tau == 0.3


@pytest.mark.parametrize("sampling", [GREEDY, T1])
def test_ngram_without_fill_proposes_nothing_without_a_match(sampling, target, prompts):
    """fill=False: a row without a match drafts nothing (a plain target step, its token from p), rows of one
    round verify different counts, and the target's cache keeps exactly the committed tokens."""
    target_lm = CachedLM(target)

    def check(seqs, rows):
        for i, seq in enumerate(seqs):
            if len(seq) - len(prompts[rows[i]]) < 24:
                torch.testing.assert_close(target_lm.row_kv(i, 0)[0], _fresh_keys(target, seq[:-1]))

    g = torch.Generator().manual_seed(2)
    result = speculative_decode(
        target_lm, NgramDraft(VOCAB, fill=False), prompts, 4, sampling, 24, set(), g, on_round=check
    )
    if sampling.greedy:
        for row, prompt in enumerate(prompts):
            assert result.tokens[row] == hf_greedy(target, prompt, 24)
    drafted = [r.drafted for r in result.rounds]
    assert 0 in drafted and max(drafted) > 0
    for r in result.rounds:
        assert r.drafted <= r.gamma == 4 and (r.drafted > 0 or (r.accepted == 0 and r.extra == "bonus"))


@pytest.mark.parametrize("name", ["confidence_stop", "schedule"])
def test_fast_path_draft_on_the_targets_decode_kv_with_ragged_lengths(name, target, prompts):
    """The static path, the draft taking the target's K/V of each round: with rows verifying different lengths
    the draft still holds exactly the target's K/V of every committed token, and greedy equals the target's."""
    from conftest import perturbed

    from specbench.decoding.forward import ForwardPath

    close = perturbed(target, 0.05, seed=3)
    fast = ForwardPath("static", "default", 96)
    target_lm, draft_lm = fast.lm(target), fast.lm(close)
    draft = ModelDraft(close, lm=draft_lm, target_prompt_kv=True, target_decode_kv=True)

    def same_kv(seqs, rows):
        assert draft_lm.n_valid_host == target_lm.n_valid_host
        for row in range(len(target_lm.slots)):
            for layer in range(len(target_lm.cache.layers)):
                assert torch.equal(torch.cat(draft_lm.row_kv(row, layer)), torch.cat(target_lm.row_kv(row, layer)))

    # greedy's q is one-hot (q(x_i) = 1, nothing to stop on): confidence_stop runs at T = 1
    sampling = T1 if name == "confidence_stop" else GREEDY
    g = torch.Generator().manual_seed(0)
    result = speculative_decode(
        target_lm, draft, prompts, 4, sampling, 24, set(), g, on_round=same_kv, policy=POLICIES.get(name), tau=0.5
    )
    if sampling.greedy:
        for row, prompt in enumerate(prompts):
            assert result.tokens[row] == hf_greedy(target, prompt, 24), f"row {row}"
    assert len({(r.round, r.drafted) for r in result.rounds}) > len({r.round for r in result.rounds})


def test_the_draft_stops_once_every_row_stopped(target, close_draft, prompts):
    """tau = 1 at T = 1 stops every row after its first draft: the draft drafts one token a round, not gamma."""
    draft = ModelDraft(close_draft)
    widths, feed = [], draft.lm.feed
    draft.lm.feed = lambda tokens: widths.append(tokens.shape[1]) or feed(tokens)
    g = torch.Generator().manual_seed(0)
    result = speculative_decode(
        CachedLM(target), draft, prompts, 4, T1, 12, set(), g, policy=POLICIES.get("confidence_stop"), tau=1.0
    )
    assert all(r.drafted == len(r.q_drafted) == 1 and r.stop == "confidence" for r in result.rounds)
    assert len(widths) == len({r.round for r in result.rounds})  # one feed per round: no draft step after the first

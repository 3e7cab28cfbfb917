"""A weight-only draft on the target's decode KV (`draft.target_decode_kv`, the fast path): after every round it holds
the target's K/V of every committed token, runs one forward a drafted token (no catch-up), and the decode stays
exact; off, or on the eager path, it keeps its own."""

from __future__ import annotations

import pytest
import torch
from conftest import hf_greedy, perturbed, tiny_llama
from test_decoder import GREEDY

from specbench.config import DraftConfig
from specbench.decoding.decoder import speculative_decode
from specbench.decoding.drafts import ModelDraft
from specbench.decoding.forward import ForwardPath
from specbench.models.draft_kinds import DRAFT_KINDS
from specbench.models.pair import Pair
from specbench.models.quant import quantize_w8a16

PATHS = ["static", "compiled"]


def lms(path: str, *models):
    fast = ForwardPath(path, "default", 96)
    return [fast.lm(m) for m in models]


def widths(lm, monkeypatch) -> list[int]:
    """Record the width of every forward `lm` runs in this test (the LM is the process's, shared by later tests)."""
    seen, feed = [], lm.feed
    monkeypatch.setattr(lm, "feed", lambda tokens: seen.append(tokens.shape[1]) or feed(tokens))
    return seen


def committed_kv(lm) -> list[torch.Tensor]:
    return [torch.cat(lm.row_kv(row, layer)) for row in range(len(lm.slots)) for layer in range(len(lm.cache.layers))]


@pytest.mark.parametrize("path", PATHS)
def test_the_draft_holds_the_targets_kv_of_every_committed_token_and_stays_exact(path, target, prompts, monkeypatch):
    close = perturbed(target, 0.05, seed=3)  # close enough for all-accepted rounds as well as rejections
    target_lm, draft_lm = lms(path, target, close)
    draft = ModelDraft(close, lm=draft_lm, target_prompt_kv=True, target_decode_kv=True)
    fed = widths(draft_lm, monkeypatch)
    rounds = []

    def same_kv(seqs, rows):
        assert draft_lm.n_valid_host == target_lm.n_valid_host
        for mine, theirs in zip(committed_kv(draft_lm), committed_kv(target_lm)):
            assert torch.equal(mine, theirs)
        rounds.append(rows)

    result = speculative_decode(target_lm, draft, prompts, 4, GREEDY, 24, set(), on_round=same_kv)
    assert draft.follows is target_lm and rounds
    assert set(fed) == {1}  # no catch-up forward, after all-accepted rounds either
    assert {0, 4} < {r.accepted for r in result.rounds}
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == hf_greedy(target, prompt, 24), f"row {row}"


@pytest.mark.parametrize("path", PATHS)
def test_a_twin_of_the_target_has_every_draft_accepted(path, target, prompts):
    # the twin proposes the target's own greedy tokens only if it reads the K/V the target wrote for the last draft
    # of an all-accepted round, which the twin never fed: a stale column would show as a rejected draft
    twin = tiny_llama(0)
    target_lm, twin_lm = lms(path, target, twin)
    draft = ModelDraft(twin, lm=twin_lm, target_prompt_kv=True, target_decode_kv=True)
    result = speculative_decode(target_lm, draft, prompts, 4, GREEDY, 24, set())
    assert [r.accepted for r in result.rounds] == [r.gamma for r in result.rounds]
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == hf_greedy(target, prompt, 24), f"row {row}"


def test_off_the_draft_keeps_its_own_kv_and_catches_up(target, prompts, monkeypatch):
    close = perturbed(target, 0.05, seed=3)
    target_lm, draft_lm = lms("static", target, close)
    draft = ModelDraft(close, lm=draft_lm, target_prompt_kv=True)  # target_decode_kv off
    fed = widths(draft_lm, monkeypatch)
    result = speculative_decode(target_lm, draft, prompts, 4, GREEDY, 24, set())
    assert draft.follows is None and 2 in fed  # the catch-up after an all-accepted round
    assert any(not torch.equal(a, b) for a, b in zip(committed_kv(draft_lm), committed_kv(target_lm)))
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == hf_greedy(target, prompt, 24), f"row {row}"


def test_the_eager_path_keeps_the_drafts_own_decode_kv(target, close_draft, prompts):
    eager = ForwardPath("eager")
    draft = ModelDraft(close_draft, lm=eager.lm(close_draft), target_prompt_kv=True, target_decode_kv=True)
    result = speculative_decode(eager.lm(target), draft, prompts, 4, GREEDY, 16, set())
    assert draft.follows is None
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == hf_greedy(target, prompt, 16), f"row {row}"


def test_take_columns_refuses_another_layout(target, prompts):
    source, deeper = lms("static", target, tiny_llama(2, layers=3))
    source.prefill(prompts)
    deeper.prefill(prompts)
    with pytest.raises(ValueError, match=r"take_columns: the source's KV is 2 layers of \(4, 2, 96, 8\).* 3 of"):
        deeper.take_columns(source, 0, 4)


@pytest.mark.parametrize(
    ("prompt_kv", "decode_kv", "follows"), [(True, True, True), (True, False, False), (False, True, False)]
)
def test_weight_only_drafts_take_the_decode_kv_unless_told_not_to(prompt_kv, decode_kv, follows, target):
    cfg = DraftConfig(kind="w8a16", target_prompt_kv=prompt_kv, target_decode_kv=decode_kv)
    pair = Pair(target, None, quantize_w8a16(target), "w8a16", set(), True, cfg, ForwardPath("static", "default", 96))
    draft = DRAFT_KINDS.get("w8a16").build(pair)
    assert draft.target_decode_kv is follows

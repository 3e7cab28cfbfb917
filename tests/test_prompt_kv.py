"""A weight-only draft on the target's prompt KV (`draft.target_prompt_kv`): `prefill_from` on both paths gives
the state a prefill gives, the decode stays exact, and a copy of the wrong rows or layout is refused."""

from __future__ import annotations

import pytest
import torch
from conftest import hf_greedy, tiny_llama
from test_decoder import GREEDY

from specbench.config import DraftConfig
from specbench.decoding.decoder import speculative_decode
from specbench.decoding.drafts import ModelDraft
from specbench.decoding.forward import ForwardPath
from specbench.models.draft_kinds import DRAFT_KINDS
from specbench.models.pair import Pair
from specbench.models.quant import quantize_w8a16

PATHS = ["eager", "static"]


def lm_on(path: str, model):
    return ForwardPath(path, "default", 96).lm(model)


def kv(lm, row: int, layer: int) -> torch.Tensor:
    return torch.cat(lm.row_kv(row, layer))


@pytest.mark.parametrize("path", PATHS)
def test_prefill_from_the_same_model_gives_the_state_its_own_prefill_gives(path, target, prompts):
    own = lm_on(path, target)
    own.prefill(prompts)
    source = lm_on(path, tiny_llama(0))  # the target's twin: its prefill is the one to copy
    source.prefill(prompts)
    copied = type(own)(target) if path == "eager" else type(own)(target, 96)  # a second LM of the target
    copied.prefill_from(source, prompts)
    assert copied.n_valid_host == own.n_valid_host == [len(p) for p in prompts]
    nxt = torch.tensor([[p[-1], p[0]] for p in prompts])
    assert torch.equal(copied.feed(nxt), own.feed(nxt))  # and every later forward reads the same KV


@pytest.mark.parametrize("path", PATHS)
def test_a_draft_on_the_targets_prompt_kv_holds_the_targets_kv_and_stays_exact(path, target, close_draft, prompts):
    target_lm, draft_lm = lm_on(path, target), lm_on(path, close_draft)
    seqs = [p + [1] for p in prompts]  # prompt + the first new token, as the decoder hands them over
    target_lm.prefill(prompts)
    ModelDraft(close_draft, lm=draft_lm, target_prompt_kv=True).prefill(seqs, target_lm)
    for row in range(len(prompts)):
        assert torch.equal(kv(draft_lm, row, 1), kv(target_lm, row, 1))
    ModelDraft(close_draft, lm=draft_lm).prefill(seqs, target_lm)  # off: its own KV, not the target's
    assert not torch.equal(kv(draft_lm, 0, 1), kv(target_lm, 0, 1))

    draft = ModelDraft(close_draft, lm=lm_on(path, close_draft), target_prompt_kv=True)
    result = speculative_decode(lm_on(path, target), draft, prompts, 4, GREEDY, 24, set())
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == hf_greedy(target, prompt, 24), f"row {row}"


@pytest.mark.parametrize("path", PATHS)
def test_prefill_from_refuses_other_rows_another_layout_or_cache_kind(path, target, prompts):
    source = lm_on(path, target)
    source.prefill(prompts[:2])
    with pytest.raises(ValueError, match=r"holds rows of \[6, 11\] tokens, the prompts have \[11, 3\]"):
        lm_on(path, tiny_llama(0)).prefill_from(source, prompts[1:3])
    deeper = tiny_llama(2, layers=3)
    with pytest.raises(ValueError, match=r"KV layout .* \(2, 2, 8\) of the source, \(3, 2, 8\) here"):
        lm_on(path, deeper).prefill_from(source, prompts[:2])
    other = lm_on("static" if path == "eager" else "eager", tiny_llama(0))  # the other cache kind
    with pytest.raises(ValueError, match=r"prefill_from: a \w+LM copies from a \w+LM, not a"):
        other.prefill_from(source, prompts[:2])


@pytest.mark.parametrize(
    ("kind", "setting", "shares"),
    [("w8a16", True, True), ("w8a16", False, False), ("model", True, False)],
)
def test_weight_only_drafts_take_the_targets_prompt_kv_unless_told_not_to(kind, setting, shares, target, close_draft):
    draft_model = quantize_w8a16(target) if kind == "w8a16" else close_draft
    cfg = DraftConfig(kind=kind, target_prompt_kv=setting)
    pair = Pair(target, None, draft_model, kind, set(), True, cfg)
    draft = DRAFT_KINDS.get(kind).build(pair)
    assert draft.target_prompt_kv is shares

"""A draft head over the most frequent ids (`draft.vocab_top`): the subset, the head, losslessness, jobs."""

from __future__ import annotations

import functools
import json
import os
import subprocess

import pandas as pd
import pytest
import torch
from conftest import VOCAB, eager_cli, hf_greedy

from specbench.audit import AuditSettings, make_decoder, run_audit, tiny_pair
from specbench.config import DraftConfig
from specbench.decoding.decoder import speculative_decode
from specbench.decoding.drafts import ModelDraft
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.sampling import SamplingConfig
from specbench.decoding.static_kv import StaticLM
from specbench.models.quant import quantize_w4a16, quantize_w8a16
from specbench.models.vocab import SubsetHead, VocabError, frequent_tokens, restricted_copy

GREEDY = SamplingConfig()


class SpaceTokenizer:
    """Token ids written as numbers separated by spaces: enough to count a corpus."""

    def __call__(self, text: str) -> dict:
        return {"input_ids": [int(t) for t in text.split()]}


def test_without_a_corpus_the_first_ids_and_every_eos_are_kept():
    assert frequent_tokens(4, 16, eos={15}) == (0, 1, 2, 15)
    assert frequent_tokens(3, 16, eos=set()) == (0, 1, 2)


def test_a_corpus_ranks_by_count_and_breaks_ties_by_id(tmp_path):
    corpus = tmp_path / "c.jsonl"
    lines = [{"turns": ["9 9 9 7", "7 12"], "n": 3}, {"nested": {"text": "12 9 5"}}]
    corpus.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    # counts: 9 -> 4, 7 -> 2, 12 -> 2, 5 -> 1; then unseen ids from 0 up
    assert frequent_tokens(5, 16, set(), SpaceTokenizer(), corpus) == (0, 5, 7, 9, 12)
    text = tmp_path / "c.txt"
    text.write_text("3 3 4")
    assert frequent_tokens(2, 16, {15}, SpaceTokenizer(), text) == (3, 15)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda p: frequent_tokens(16, 16, set()), r"draft.vocab_top=16: must be in \[1, 15\]"),
        (lambda p: frequent_tokens(4, 16, set(), SpaceTokenizer(), p / "none.txt"), r"vocab_corpus=.*no such file"),
        (lambda p: frequent_tokens(4, 16, set(), SpaceTokenizer(), p / "bad.jsonl"), r"line 2 is not JSON"),
        (lambda p: frequent_tokens(4, 16, set(), None, p / "bad.jsonl"), r"no tokenizer"),
    ],
)
def test_bad_vocabulary_settings_name_the_field(call, match, tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"a": "1"}\n{oops\n')
    with pytest.raises(VocabError, match=match):
        call(tmp_path)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kind": "ngram", "vocab_top": 8}, r"draft.vocab_top=8: draft.kind='ngram' has no head"),
        ({"kind": "w8a16", "vocab_top": -1}, r"draft.vocab_top=-1: must be an integer >= 0"),
        ({"kind": "w8a16", "vocab_corpus": "x.txt"}, r"draft.vocab_corpus='x.txt' is only read with"),
    ],
)
def test_bad_draft_config_names_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DraftConfig(**kwargs)


def test_subset_head_scores_the_kept_ids_and_masks_the_rest(target):
    keep = (1, 5, 6, 40, 95)
    draft = restricted_copy(target, keep)
    assert isinstance(draft.lm_head, SubsetHead) and not isinstance(target.lm_head, SubsetHead)
    x = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.inference_mode():
        full, sub = target(x).logits, draft(x).logits  # [1, 5, V]
    assert sub.shape == full.shape
    torch.testing.assert_close(sub[..., list(keep)], full[..., list(keep)], rtol=1e-12, atol=1e-12)
    others = [i for i in range(VOCAB) if i not in keep]
    assert torch.isneginf(sub[..., others]).all()
    assert torch.softmax(sub, -1)[..., others].sum() == 0


@pytest.mark.parametrize("quantize", [quantize_w8a16, quantize_w4a16, functools.partial(quantize_w4a16, head="int8")])
def test_restricting_before_quantizing_equals_quantizing_every_row(quantize, target):
    """Every output row is quantized on its own, so restricting first keeps the kept rows' weights."""
    keep = tuple(range(0, VOCAB, 3))
    x = torch.tensor([[7, 2, 9]])
    with torch.inference_mode():
        whole, sub = quantize(target)(x).logits, quantize(target, keep)(x).logits
    torch.testing.assert_close(sub[..., list(keep)], whole[..., list(keep)], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("path", ["eager", "static"])
def test_greedy_output_equals_the_target_when_its_token_is_outside_the_subset(path, target, close_draft, prompts):
    """Drop from the subset the tokens the target emits most: the draft cannot propose them, every such
    position is rejected, and the output is still the target's."""
    expected = [hf_greedy(target, p, 24) for p in prompts]
    emitted = pd.Series([t for row in expected for t in row]).value_counts()
    dropped = set(emitted.index[:3])
    keep = tuple(i for i in range(VOCAB) if i not in dropped)
    draft_model = restricted_copy(close_draft, keep)
    make = CachedLM if path == "eager" else (lambda model: StaticLM(model, 64))
    result = speculative_decode(
        make(target), ModelDraft(draft_model, lm=make(draft_model)), prompts, 4, GREEDY, 24, set()
    )
    assert result.tokens == expected
    assert any(t in dropped for row in result.tokens for t in row)


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=1.0, top_k=5)])
def test_sampled_output_is_distributed_as_the_target(sampling):
    """The exact audit (every continuation enumerated) with a draft that can propose half the vocabulary."""
    torch.set_num_threads(1)
    target, draft = tiny_pair()
    draft = restricted_copy(draft, tuple(range(0, 16, 2)))
    settings = AuditSettings()
    decoder = make_decoder("speculative", target, draft, 2, sampling, set(), settings)
    prompts = [[1, 2, 3], [5, 4]]
    row = run_audit(target, decoder, prompts, sampling, set(), settings).summary.iloc[0]
    assert row.reference == "exact" and row.verdict == "pass"


def test_job_labels_rows_with_the_head_size(tmp_path):
    """A real Hydra job: rows name the restricted draft, so reports never pool it with the whole head."""
    args = ["pair=tiny", "draft=w8a16", "draft.vocab_top=64", "workload=synthetic", "report=false"]
    args += ["max_new_tokens=6", "workload.n_prompts=2", "sweep_name=v", f"runs_dir={tmp_path}", "gamma=2"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(eager_cli(*args), capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    (job,) = tmp_path.glob("v/*")
    rounds = pd.read_parquet(job / "rounds.parquet")
    assert set(rounds.draft) == {"w8a16(tiny-llama)+top64"}
    bad = subprocess.run(
        eager_cli(*args[:2], "draft.vocab_top=99999", *args[3:]),
        capture_output=True,
        text=True,
        env=env,
    )
    said = bad.stdout + bad.stderr
    assert bad.returncode != 0 and "draft.vocab_top=99999: must be in [1, 511]" in said
    assert "Traceback" not in said

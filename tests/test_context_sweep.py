"""`+sweep=context`: prompts lengthened with real passages to a token count (workloads.pad_to_tokens)."""

from __future__ import annotations

import pytest
from conftest import needs_embedded
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer

from specbench.bench.workloads import WorkloadError, context_documents, load_workload, pad_to_tokens


@pytest.fixture(scope="module")
def tokenizer():
    from specbench.models.loading import model_dir

    return AutoTokenizer.from_pretrained(model_dir("embedded"))


@needs_embedded
@pytest.mark.embedded
@pytest.mark.parametrize("tokens", [128, 512, 2048])
def test_prompts_reach_the_token_count_with_real_text_and_keep_their_question(tokenizer, tokens):
    docs = context_documents("builtin")
    assert {d.category for d in docs} == {"summarization", "rag"}
    for p in load_workload("builtin", categories=["qa", "code"], limit_per_category=1):
        ids = pad_to_tokens(p, tokenizer, tokens, docs)
        assert tokens - 4 <= len(ids) <= tokens
        text = tokenizer.decode(ids)
        assert p.messages[-1]["content"] in text  # the question is whole, after the passages
        assert text.index(docs[0].messages[0]["content"][:60]) < text.index(p.messages[-1]["content"])


@needs_embedded
@pytest.mark.embedded
def test_long_prompts_stay_whole_and_too_few_passages_fail(tokenizer):
    docs = context_documents("builtin")
    rag = load_workload("builtin", categories=["rag"], limit_per_category=1)[0]
    whole = tokenizer(
        tokenizer.apply_chat_template(rag.messages, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )["input_ids"]
    assert pad_to_tokens(rag, tokenizer, 16, docs) == whole
    with pytest.raises(WorkloadError, match=r"workload.context_tokens=100000: the 18 context documents hold only"):
        pad_to_tokens(rag, tokenizer, 100_000, docs)


def test_context_sweep_composes_and_synthetic_is_refused():
    from specbench.app import CONF_DIR, to_config

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = to_config(compose("config", overrides=["+sweep=context", "workload.context_tokens=512"]))
        assert cfg.workload.context_tokens == 512 and cfg.workload.categories == ["qa", "code", "chat"]
        with pytest.raises(ValueError, match=r"workload.context_tokens=64: synthetic .* workload.prompt_tokens"):
            to_config(compose("config", overrides=["pair=tiny", "workload=synthetic", "workload.context_tokens=64"]))

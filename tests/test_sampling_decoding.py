"""Penalties and bans inside the decoders: greedy output equals transformers' generate() token for
token (tiny float64 pairs, and the embedded pair in float32), and hf_assisted maps them exactly."""

from __future__ import annotations

import pytest
from conftest import VOCAB, hf_greedy, needs_embedded, perturbed

from specbench.config import Config, SamplingSpec
from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.drafts import ModelDraft, NgramDraft
from specbench.decoding.hf_assisted import check_sampling, generate_kwargs, hf_assisted_decode
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.sampling import SamplingConfig
from specbench.decoding.timing import PhaseTimer

N = 24


@pytest.fixture(scope="module")
def near_draft(target):
    return perturbed(target, 0.05, seed=1)  # accepts often: later positions of a round matter


@pytest.fixture(scope="module")
def banned(target, prompts):
    """A bigram and a token that plain greedy decoding (with the penalty) emits, so banning them bites."""
    out = hf_greedy(target, prompts[0], N, repetition_penalty=1.3)
    return (out[2], out[3]), out[6]


@pytest.mark.parametrize("draft_kind", ["model", "ngram"])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_with_penalty_and_bans_equals_generate(draft_kind, batch, target, near_draft, prompts, banned):
    bigram, token = banned
    sampling = SamplingConfig(repetition_penalty=1.3, banned_token_ids=(token,), banned_sequences=(bigram,))
    hf = dict(repetition_penalty=1.3, bad_words_ids=[[token], list(bigram)])
    draft = ModelDraft(near_draft) if draft_kind == "model" else NgramDraft(VOCAB)
    spec = speculative_decode(CachedLM(target), draft, prompts[:batch], 4, sampling, N, set())
    base = autoregressive_decode(CachedLM(target), prompts[:batch], sampling, N, set())
    for row, prompt in enumerate(prompts[:batch]):
        expected = hf_greedy(target, prompt, N, **hf)
        assert spec.tokens[row] == expected, f"speculative row {row}"
        assert base.tokens[row] == expected, f"autoregressive row {row}"
    assert hf_greedy(target, prompts[0], N, **hf) != hf_greedy(
        target, prompts[0], N, repetition_penalty=1.3
    )  # bans bite
    assert hf_greedy(target, prompts[0], N, repetition_penalty=1.3) != hf_greedy(target, prompts[0], N)  # penalty bites
    if draft_kind == "model":
        assert sum(r.accepted for r in spec.rounds) > len(spec.rounds)  # drafts inside a round were verified


def test_hf_assisted_greedy_with_penalty_and_bans_equals_generate(target, near_draft, prompts, banned):
    bigram, token = banned
    sampling = SamplingConfig(repetition_penalty=1.3, banned_token_ids=(token,), banned_sequences=(bigram,))
    result = hf_assisted_decode(target, near_draft, [prompts[0]], 3, sampling, N, set(), 0, PhaseTimer())
    assert result.tokens[0][:N] == hf_greedy(
        target, prompts[0], N, repetition_penalty=1.3, bad_words_ids=[[token], list(bigram)]
    )


def test_hf_assisted_maps_processors_and_refuses_what_transformers_lacks(target):
    sampling = SamplingConfig(1.0, min_p=0.1, repetition_penalty=1.3, banned_token_ids=(4,), banned_sequences=((1, 2),))
    config, _ = target._prepare_generation_config(None, **generate_kwargs(sampling, 4, set()))
    assert config.repetition_penalty == 1.3 and config.min_p == 0.1 and config.bad_words_ids == [[4], [1, 2]]
    config, _ = target._prepare_generation_config(None, **generate_kwargs(SamplingConfig(1.0), 4, set()))
    assert config.repetition_penalty is None and config.min_p is None and config.bad_words_ids is None
    with pytest.raises(ValueError, match="sampling.frequency_penalty=0.5: transformers' generate has no"):
        check_sampling(SamplingConfig(1.0, frequency_penalty=0.5), set())
    with pytest.raises(ValueError, match=r"includes EOS \[2\]"):
        check_sampling(SamplingConfig(1.0, banned_token_ids=(2,)), {2})
    with pytest.raises(ValueError, match="presence_penalty"):
        Config(decoder="hf_assisted", sampling=SamplingSpec(temperature=1.0, presence_penalty=0.5))


def test_sampling_spec_builds_and_validates():
    spec = SamplingSpec(
        name="x", temperature=1.0, min_p=0.05, repetition_penalty=1.2, banned_token_ids=[3], banned_sequences=[[1, 2]]
    )
    built = spec.build()
    assert built.banned_sequences == ((1, 2),) and built.min_p == 0.05 and hash(built)
    with pytest.raises(ValueError, match="sampling.repetition_penalty=0.0"):
        SamplingSpec(repetition_penalty=0.0)


@needs_embedded
@pytest.mark.embedded
def test_embedded_greedy_with_penalty_and_bans_equals_generate_fp32():
    """specbench.decode (W8A16 draft, B = 1 and a ragged B = 4) against generate() in float32."""
    import specbench
    from specbench.models.loading import load_model

    model, tok = load_model("embedded", dtype="float32")
    questions = [
        "Name three primary colours.",
        "Write a haiku about autumn.",
        "What is 2 + 2?",
        "Translate to French: good morning, my friend.",
    ]
    ids = [
        tok(
            tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
            return_tensors="pt",
        )["input_ids"]
        for q in questions
    ]
    n = 24
    plain = model.generate(
        ids[0], max_new_tokens=n, do_sample=False, repetition_penalty=1.3, pad_token_id=tok.eos_token_id
    )[0, ids[0].shape[1] :].tolist()
    bigram, token = (plain[3], plain[4]), plain[8]
    hf = dict(repetition_penalty=1.3, bad_words_ids=[[token], list(bigram)])
    for batch in (questions[:1], questions):
        out = specbench.decode(
            batch,
            draft="w8a16",
            dtype="float32",
            max_new_tokens=n,
            gamma=4,
            forward="eager",
            repetition_penalty=1.3,
            banned_token_ids=[token],
            banned_sequences=[bigram],
        )
        for row in range(len(batch)):
            ref = model.generate(ids[row], max_new_tokens=n, do_sample=False, pad_token_id=tok.eos_token_id, **hf)
            assert out.tokens[row] == ref[0, ids[row].shape[1] :].tolist(), f"B={len(batch)} row {row}"
    assert out.tokens[0] != plain  # the bans changed the output

"""process_logits: every processor equals transformers' own (ties included), per-position contexts,
and clear errors on bad settings."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specbench.decoding.sampling import (
    SamplingConfig,
    TokenContext,
    first_argmax,
    next_tokens,
    process_logits,
    sample,
)

V = 50


def random_batch(rows: int, seed: int, vocab: int = V) -> tuple[torch.Tensor, list[list[int]], list[int]]:
    """Logits [rows, vocab] and contexts (prompt + generated, ragged) with repeats, so penalties bite."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 3
    lengths = torch.randint(1, 12, (rows,), generator=g).tolist()
    prompt_lens = [torch.randint(1, n + 1, (1,), generator=g).item() for n in lengths]
    seqs = [torch.randint(0, 12, (n,), generator=g).tolist() for n in lengths]  # ids < 12: many repeats
    return logits, seqs, prompt_lens


def hf_process(logits, seqs, processors) -> torch.Tensor:
    """transformers' processors row by row (each row its own input_ids) -> probabilities."""
    out = [LogitsProcessorList(processors)(torch.tensor([s]), logits[i : i + 1].clone()) for i, s in enumerate(seqs)]
    return torch.cat(out).softmax(-1)


def ours(logits, seqs, prompt_lens, sampling) -> torch.Tensor:
    return process_logits(logits, sampling, TokenContext.build(sampling, seqs, prompt_lens, logits.shape[-1], "cpu"))


# ----------------------------------------------------------------------------- equal to transformers


def test_repetition_penalty_bans_and_warpers_equal_transformers():
    logits, seqs, lens = random_batch(64, 0)
    bad = [[3], [7, 2], [1, 1, 4]]
    sampling = SamplingConfig(
        0.7,
        top_k=20,
        top_p=0.9,
        min_p=0.05,
        repetition_penalty=1.3,
        banned_token_ids=(3,),
        banned_sequences=((7, 2), (1, 1, 4)),
    )
    hf = [
        RepetitionPenaltyLogitsProcessor(1.3),
        NoBadWordsLogitsProcessor(bad),
        TemperatureLogitsWarper(0.7),
        TopKLogitsWarper(20),
        TopPLogitsWarper(0.9),
        MinPLogitsWarper(0.05),
    ]
    expected = hf_process(logits, seqs, hf)
    got = ours(logits, seqs, lens, sampling)
    assert torch.equal(got > 0, expected > 0)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    # the bans did something: a sequence prefix matched in some row
    assert any(s[-1] == 7 for s in seqs) and (got[[s[-1] == 7 for s in seqs], 2] == 0).all()


@pytest.mark.parametrize("penalty", [0.7, 1.0, 1.5])
def test_greedy_with_penalty_is_the_argmax_of_transformers_scores(penalty):
    logits, seqs, lens = random_batch(64, 1)
    sampling = SamplingConfig(repetition_penalty=penalty, banned_token_ids=(0, 5))
    processors = [NoBadWordsLogitsProcessor([[0], [5]])]
    if penalty != 1.0:
        processors.insert(0, RepetitionPenaltyLogitsProcessor(penalty))
    scores = torch.cat(
        [LogitsProcessorList(processors)(torch.tensor([s]), logits[i : i + 1].clone()) for i, s in enumerate(seqs)]
    )
    assert ours(logits, seqs, lens, sampling).argmax(-1).tolist() == scores.argmax(-1).tolist()


def test_frequency_and_presence_penalties_count_generated_tokens_only():
    logits, seqs, lens = random_batch(32, 2)
    sampling = SamplingConfig(1.0, frequency_penalty=0.5, presence_penalty=-0.25)
    expected = logits.clone()
    for i, (seq, n) in enumerate(zip(seqs, lens)):
        counts = torch.bincount(torch.tensor(seq[n:], dtype=torch.long), minlength=V).float()
        expected[i] -= 0.5 * counts + (-0.25) * (counts > 0).float()
    torch.testing.assert_close(ours(logits, seqs, lens, sampling), expected.softmax(-1))


# ----------------------------------------------------------------------------- ties (issue 10, defect 7)


@pytest.mark.parametrize(
    "sampling, warpers",
    [
        (SamplingConfig(1.0, top_p=0.9), [TopPLogitsWarper(0.9)]),
        (SamplingConfig(0.7, top_p=0.8), [TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.8)]),
        (SamplingConfig(1.0, top_k=50), [TopKLogitsWarper(50)]),
        (SamplingConfig(1.0, top_k=40, top_p=0.9), [TopKLogitsWarper(40), TopPLogitsWarper(0.9)]),
    ],
    ids=["top_p", "T_top_p", "top_k", "top_k_top_p"],
)
def test_ties_in_bf16_logits_keep_the_same_tokens_as_transformers(sampling, warpers):
    """bf16 logits tie often; at the top-p / top-k boundary the same members of a tied group must stay."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(256, 4000, generator=g) * 2).bfloat16().float()  # [rows, V], many exact ties
    expected = LogitsProcessorList(warpers)(torch.zeros(256, 1, dtype=torch.long), logits.clone()) > float("-inf")
    kept = process_logits(logits, sampling) > 0
    assert torch.equal(kept, expected), f"{(kept != expected).any(-1).sum().item()} of 256 rows differ"
    # ...and also on a [B, gamma + 1, V] verify-shaped tensor (the decoder's call)
    assert torch.equal(process_logits(logits.view(64, 4, 4000), sampling).view(256, 4000) > 0, expected)


# ----------------------------------------------------------------------------- per-position contexts


def test_expand_and_append_equal_contexts_built_from_scratch():
    sampling = SamplingConfig(1.0, repetition_penalty=1.2, frequency_penalty=0.3, banned_sequences=((4, 5, 6),))
    _, seqs, lens = random_batch(6, 3)
    drafts = torch.randint(0, 12, (6, 3), generator=torch.Generator().manual_seed(4))
    context = TokenContext.build(sampling, seqs, lens, V, "cpu")
    expanded = context.expand(drafts)  # [B, 4, ...]
    appended = context
    for j in range(4):
        fresh = TokenContext.build(sampling, [s + drafts[i, :j].tolist() for i, s in enumerate(seqs)], lens, V, "cpu")
        for name in ("seen", "counts", "tail"):
            assert torch.equal(getattr(expanded, name)[:, j], getattr(fresh, name)), (name, j)
            assert torch.equal(getattr(appended, name), getattr(fresh, name)), (name, j)
        if j < 3:
            appended = appended.append(drafts[:, j])


def test_context_is_none_when_no_processor_reads_it():
    assert TokenContext.build(SamplingConfig(1.0, top_k=5, banned_token_ids=(3,)), [[1, 2]], [1], V, "cpu") is None
    assert SamplingConfig(banned_sequences=((3,),)).uses_context is False  # one-token sequences ban unconditionally
    assert SamplingConfig(banned_sequences=((3,),)).banned_ids == (3,)


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(repetition_penalty=0.0), r"sampling.repetition_penalty=0.0: must be a number > 0"),
        (dict(repetition_penalty=-1.0), r"sampling.repetition_penalty=-1.0: must be a number > 0"),
        (dict(min_p=1.5), r"sampling.min_p=1.5: must be a number in \[0.0, 1.0\]"),
        (dict(min_p=-0.1), r"sampling.min_p=-0.1: must be a number in \[0.0, 1.0\]"),
        (dict(frequency_penalty=2.5), r"sampling.frequency_penalty=2.5: must be a number in \[-2.0, 2.0\]"),
        (dict(presence_penalty=-3), r"sampling.presence_penalty=-3: must be a number in \[-2.0, 2.0\]"),
        (dict(banned_token_ids=(3, -1)), r"sampling.banned_token_ids=\[3, -1\]: token ids must be integers >= 0"),
        (dict(banned_sequences=((1, 2), ())), r"sampling.banned_sequences=.*: sequences must be non-empty"),
    ],
)
def test_bad_settings_name_the_field_and_the_allowed_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(1.0, **kwargs)


def test_bad_token_ids_and_missing_context_are_clear_errors():
    logits = torch.zeros(2, V)
    with pytest.raises(ValueError, match=rf"banned tokens \[50, 99\]: token ids must be in \[0, vocab_size={V}\)"):
        process_logits(logits, SamplingConfig(1.0, banned_token_ids=(1, 50), banned_sequences=((2, 99),)))
    with pytest.raises(ValueError, match="bans all 50 tokens"):
        process_logits(logits, SamplingConfig(1.0, banned_token_ids=tuple(range(V))))
    with pytest.raises(
        ValueError, match="repetition_penalty=1.2' reads the context: process_logits needs a TokenContext"
    ):
        process_logits(logits, SamplingConfig(1.0, repetition_penalty=1.2))


def test_describe_names_only_what_is_set():
    assert SamplingConfig(1.0, top_k=5).describe() == "T=1 top_k=5"
    assert SamplingConfig().describe() == "greedy"
    s = SamplingConfig(1.0, min_p=0.1, repetition_penalty=1.3, banned_sequences=((1, 2),))
    assert s.describe() == "T=1 min_p=0.1 repetition_penalty=1.3 banned_sequences=[[1,2]]"


# ----------------------------------------------------------------------------- drawing


def test_one_hot_rows_are_drawn_without_advancing_the_generator():
    """Regression (issue 11, the baseline's C_o): a greedy step's one-hot p used to go through
    torch.multinomial, which draws a random number per vocabulary entry (~1 ms at V = 49152). A row
    with one nonzero entry is now taken as it is: same token, generator untouched."""
    from specbench.decoding.sampling import sample

    probs = torch.zeros(3, 49152)
    probs[0, 5], probs[1, 49151], probs[2, 0] = 1.0, 1.0, 0.25  # row 2: one nonzero entry, not normalised
    g = torch.Generator().manual_seed(3)
    state = g.get_state()
    assert sample(probs, g).tolist() == [5, 49151, 0]
    assert torch.equal(g.get_state(), state)


def test_rows_with_two_nonzero_entries_are_still_sampled():
    """Only certain draws skip the generator: a row with two candidates is drawn from, with both seen."""
    from specbench.decoding.sampling import sample

    probs = torch.zeros(2, 10)
    probs[0, 3] = 1.0
    probs[1, [2, 7]] = 0.5
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    draws = {tuple(sample(probs, g).tolist()) for _ in range(200)}
    assert draws == {(3, 2), (3, 7)}
    assert not torch.equal(g.get_state(), state)


def test_greedy_baseline_draws_no_random_numbers(target, prompts):
    """Regression: the greedy autoregressive baseline leaves its generator as it found it (it used to
    advance it at every step through multinomial), and still decodes transformers' greedy tokens."""
    from conftest import hf_greedy

    from specbench.decoding.decoder import autoregressive_decode
    from specbench.decoding.kvcache import CachedLM

    g = torch.Generator().manual_seed(11)
    state = g.get_state()
    out = autoregressive_decode(CachedLM(target), prompts[:2], SamplingConfig(), 8, set(), g)
    assert torch.equal(g.get_state(), state)
    assert out.tokens == [hf_greedy(target, p, 8) for p in prompts[:2]]


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(),
        SamplingConfig(repetition_penalty=1.5, banned_token_ids=(3, 7)),
        SamplingConfig(temperature=1.0, top_k=10),
        SamplingConfig(temperature=0.7, top_p=0.9, frequency_penalty=0.5),
    ],
)
def test_next_tokens_are_the_sampled_tokens_of_the_processed_distribution(sampling):
    """The decoders' shortcut (argmax of the processed logits under greedy, no one-hot) gives the tokens
    `sample(process_logits(...))` gives, from the same generator state, and leaves the generator where
    it would."""
    logits, seqs, lens = random_batch(64, seed=3)
    context = TokenContext.build(sampling, seqs, lens, V, "cpu")
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    expected = sample(process_logits(logits, sampling, context), g1)
    assert torch.equal(next_tokens(logits, sampling, context, g2), expected)
    assert torch.equal(g1.get_state(), g2.get_state())
    if sampling.greedy:
        p = process_logits(logits, sampling, context)
        assert torch.equal(sample(p, certain=True), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_first_argmax_is_argmax_on_ties_banned_rows_and_nan(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (64, 5, 40), generator=g).to(dtype)  # three values: ties in nearly every row
    x[0, 0] = float("-inf")  # a row with every token banned
    x[1, :, ::3] = float("-inf")
    x[2, 1, 7] = float("nan")
    assert torch.equal(first_argmax(x), x.argmax(-1))
    one_hot = torch.zeros(3, 49152, dtype=dtype).index_fill_(-1, torch.tensor([5, 100]), 1.0)  # tie far apart
    assert first_argmax(one_hot).tolist() == one_hot.argmax(-1).tolist() == [5, 5, 5]

"""The lossless audit: exact enumeration, the statistics, the broken variants it must catch,
and transformers' assisted generation as a decoder under test.

Everything runs on tiny float64 models (vocab 16) with fixed seeds, so the verdicts are
deterministic. The false-alarm rate is estimated by the slow test at the end (and by
scripts/audit_false_alarms.py with more seeds).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specbench.audit import (
    PAD,
    TINY_PROMPTS,
    VARIANTS,
    AuditSettings,
    SharedPrefillLM,
    exact_distribution,
    hf_assisted_decoder,
    make_decoder,
    run_audit,
    speculative_decoder,
    tiny_pair,
)
from specbench.audit.cli import main
from specbench.audit.stats import detectable_tv, gof_test, holm, noncentrality_for_power, two_sample_test
from specbench.decoding.decoder import speculative_decode
from specbench.decoding.drafts import ModelDraft
from specbench.decoding.hf_assisted import generate_kwargs, hf_assisted_decode
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.sampling import SamplingConfig, process_logits
from specbench.decoding.timing import PhaseTimer

TOPK = SamplingConfig(temperature=1.0, top_k=5)  # the setting every broken variant is tested at
PLAIN = SamplingConfig(temperature=1.0)
# penalty_committed_only only differs from the correct decoder where a penalty reads the drafts
VARIANT_SAMPLING = {"penalty_committed_only": SamplingConfig(temperature=1.0, top_k=5, repetition_penalty=1.5)}
PROCESSORS = {
    "repetition_penalty": SamplingConfig(1.0, repetition_penalty=1.5),
    "frequency_penalty": SamplingConfig(1.0, frequency_penalty=0.5),
    "presence_penalty": SamplingConfig(1.0, presence_penalty=1.0),
    "min_p": SamplingConfig(1.0, min_p=0.1),
    "banned_token_ids": SamplingConfig(1.0, banned_token_ids=(3, 8)),
    "banned_sequences": SamplingConfig(1.0, banned_sequences=((3, 5), (7, 7), (11, 2, 4))),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.fixture(scope="module")
def cache():
    return {}  # enumerated distributions, shared by the audits of this module


def audit(pair, cache, decoder_name, sampling, settings=None, prompts=TINY_PROMPTS, gamma=2):
    target, draft = pair
    settings = settings or AuditSettings()
    decoder = make_decoder(decoder_name, target, draft, gamma, sampling, set(), settings)
    return run_audit(target, decoder, [list(p) for p in prompts], sampling, set(), settings, cache=cache)


# ----------------------------------------------------------------------------- exact mode


def test_exact_distribution_sums_to_one_and_is_the_product_of_conditionals(pair):
    target, _ = pair
    prompt = TINY_PROMPTS[0]
    outcomes, probs = exact_distribution(target, prompt, PLAIN, 3)
    assert outcomes.shape == (16**3, 3) and len({tuple(o) for o in outcomes.tolist()}) == 16**3
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    # independent check: one full forward per continuation, product of the processed p
    rng = np.random.default_rng(0)
    for i in rng.choice(len(outcomes), 5, replace=False):
        seq = outcomes[i].tolist()
        with torch.no_grad():
            logits = target(input_ids=torch.tensor([prompt + seq])).logits[0]
        p = process_logits(logits[len(prompt) - 1 : -1], PLAIN).double()
        expected = float(torch.prod(p[torch.arange(3), torch.tensor(seq)] / p.sum(-1)))
        assert probs[i] == pytest.approx(expected, rel=1e-5)


def test_exact_distribution_with_top_k_and_eos(pair):
    target, _ = pair
    outcomes, probs = exact_distribution(target, TINY_PROMPTS[1], TOPK, 3, eos_token_ids={2, 5})
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    assert len(outcomes) <= 5**3 and (probs > 0).all()
    ended = np.isin(outcomes[:, :2], [2, 5])
    assert (outcomes[:, 1:][ended] == PAD).all()  # after an EOS only padding
    assert (outcomes[:, :2][~ended] != PAD).all()
    with pytest.raises(ValueError, match="max_enumerate"):
        exact_distribution(target, TINY_PROMPTS[1], PLAIN, 3, max_outcomes=100)


def test_plain_target_sampling_matches_the_enumerated_distribution(pair, cache):
    """The reference decoder itself passes exact mode: enumeration and sampling agree."""
    result = audit(pair, cache, "autoregressive", TOPK)
    row = result.summary.iloc[0]
    assert row.reference == "exact" and row.tests >= 20
    assert row.verdict == "pass", result.tests.sort_values("p_value").head()
    assert row.tv_lo <= row.tv_null  # the TV interval reaches down to the noise floor


# ----------------------------------------------------------------------------- statistics


def test_holm_adjustment():
    adjusted = holm(np.array([0.01, 0.04, 0.03, 0.005]))
    np.testing.assert_allclose(adjusted, [0.03, 0.06, 0.06, 0.02])
    assert holm(np.array([0.5])).tolist() == [0.5]


def test_detectable_tv_has_the_promised_power():
    """Power of the chi-square GOF against the worst-case deviation of TV = detectable_tv."""
    df, n, level, power = 9, 2000, 0.001, 0.8
    lam = noncentrality_for_power(df, level, power)
    from scipy import stats

    assert stats.ncx2.sf(stats.chi2.isf(level, df), df, lam) == pytest.approx(power, abs=1e-4)
    tv = detectable_tv(df, n, level, power)
    p = np.full(10, 0.1)
    q = p * (1 + 2 * tv * np.array([1, -1] * 5))  # |d| proportional to p: the hardest shape, TV = tv
    assert 0.5 * np.abs(q - p).sum() == pytest.approx(tv)
    rng = np.random.default_rng(1)
    counts = rng.multinomial(n, q, size=2000)
    pvals = stats.chisquare(counts, n * p, axis=1).pvalue
    assert 0.75 < np.mean(pvals < level) < 0.86


def test_gof_and_two_sample_tests_pool_bins_and_flag_impossible_outcomes():
    settings = AuditSettings(bootstrap=200)
    rng = np.random.default_rng(0)
    prob = np.array([0.5, 0.3, 0.15] + [0.05 / 50] * 50)
    obs = rng.multinomial(1000, prob).astype(float)
    res = gof_test(obs, prob, settings, rng)
    assert res["kind"] == "gof" and res["bins"] == 4 and res["p_value"] > 0.001  # tail pooled into "other"
    obs_bad = obs.copy()
    obs_bad[-1] += 1
    res = gof_test(obs_bad, np.append(prob[:-1], 0.0) / prob[:-1].sum(), settings, rng)
    assert res["kind"] == "support" and res["p_value"] == 0.0
    a = rng.multinomial(800, prob).astype(float)
    b = rng.multinomial(1200, prob).astype(float)
    res = two_sample_test(a, b, settings, rng)
    assert res["kind"] == "g-test" and res["p_value"] > 0.001 and res["tv_lo"] <= res["tv_null"]
    shifted = rng.multinomial(800, np.roll(prob, 1)).astype(float)
    assert two_sample_test(shifted, b, settings, rng)["p_value"] < 1e-10


# ----------------------------------------------------------------------------- decoders


def test_shared_prefill_gives_the_same_tokens_as_per_row_prefill(pair):
    target, draft = pair
    prompts = [TINY_PROMPTS[0]] * 64
    out = []
    for lm in (CachedLM, SharedPrefillLM):
        d = ModelDraft(draft)
        d.lm = lm(draft)
        g = torch.Generator().manual_seed(7)
        out.append(speculative_decode(lm(target), d, prompts, 2, TOPK, 6, set(), g).tokens)
    assert out[0] == out[1]


def test_correct_decoder_passes_exact_mode(pair, cache):
    for sampling in (TOPK, SamplingConfig(temperature=0.8, top_p=0.9)):
        result = audit(pair, cache, "speculative", sampling)
        row = result.summary.iloc[0]
        assert row.reference == "exact" and row.tests >= 20
        assert row.verdict == "pass", result.tests.sort_values("p_value").head()
        assert row.detectable_tv < 0.1


def test_correct_decoder_passes_and_a_broken_one_fails_in_sample_mode(pair, cache):
    settings = AuditSettings(reference="sample")
    good = audit(pair, cache, "speculative", PLAIN, settings).summary.iloc[0]
    assert good.reference.startswith("sample") and good.verdict == "pass"
    bad = audit(pair, cache, "broken:p_not_residual", PLAIN, settings).summary.iloc[0]
    assert bad.verdict == "FAIL" and bad.p_value < 1e-6


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_broken_variants_fail_at_default_settings(pair, cache, variant):
    result = audit(pair, cache, f"broken:{variant}", VARIANT_SAMPLING.get(variant, TOPK))
    row = result.summary.iloc[0]
    assert row.verdict == "FAIL" and row.p_value < AuditSettings().alpha
    assert row.tv_lo > row.tv_null  # the deviation is visible in the TV estimate too


@pytest.mark.parametrize("variant", ["keep_after_reject", "bonus_wrong_position"])
def test_broken_variants_fail_statistically_without_top_k(pair, cache, variant):
    """Under top-k these two also emit impossible tokens; without it the detection is by the chi-square tests."""
    result = audit(pair, cache, f"broken:{variant}", PLAIN)
    assert result.summary.iloc[0].verdict == "FAIL"
    assert set(result.tests["kind"]) == {"gof"}
    assert result.tests["p_adjusted"].min() < 1e-6


@pytest.mark.parametrize("processor", list(PROCESSORS))
def test_correct_decoder_passes_exact_mode_with_every_processor(pair, cache, processor):
    """T=1, tokens = gamma + 2: a whole round, bonus included, under each penalty / filter / ban."""
    sampling = PROCESSORS[processor]
    result = audit(pair, cache, "speculative", sampling)
    row = result.summary.iloc[0]
    assert row.reference == "exact" and row.tests >= 20 and processor in row.sampling
    assert row.verdict == "pass", result.tests.sort_values("p_value").head()


def test_penalty_committed_only_fails_statistically_without_top_k(pair, cache):
    """Without top-k no impossible token appears: the chi-square tests alone catch the missing drafts."""
    result = audit(pair, cache, "broken:penalty_committed_only", PROCESSORS["repetition_penalty"])
    assert result.summary.iloc[0].verdict == "FAIL" and set(result.tests["kind"]) == {"gof"}
    assert result.tests["p_adjusted"].min() < 1e-4


def test_greedy_audit_checks_the_support(pair, cache):
    """Greedy: p is one-hot, the only check is that no other continuation ever appears."""
    greedy = SamplingConfig()
    settings = AuditSettings(samples=256)
    good = audit(pair, cache, "speculative", greedy, settings)
    assert good.summary.iloc[0].verdict == "pass" and good.summary.iloc[0].tests == 0 and good.notes
    bad = audit(pair, cache, "broken:bonus_wrong_position", greedy, settings)
    assert bad.summary.iloc[0].verdict == "FAIL" and "support" in set(bad.tests["kind"])


# ----------------------------------------------------------------------------- transformers' assisted generation


def test_hf_assisted_greedy_equals_plain_greedy_generate(pair):
    target, draft = pair
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold", "eos_token_id")
    before = {k: getattr(draft.generation_config, k, None) for k in keys}
    lengths, verify = [], []
    hook = target.register_forward_pre_hook(lambda m, a, k: lengths.append(k["input_ids"].shape[1]), with_kwargs=True)
    timer = PhaseTimer()
    try:
        for prompt in TINY_PROMPTS:
            result = hf_assisted_decode(target, draft, [prompt], 3, SamplingConfig(), 24, set(), 0, timer)
            verify.append(lengths[1:])  # the first forward also carries the prompt
            lengths.clear()
            plain = target.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=24, eos_token_id=None, pad_token_id=0
            )
            assert result.tokens == [plain[0, len(prompt) :].tolist()]
            record = result.requests[0]
            assert record.new_tokens == 24 and record.finished_by == "max_new_tokens"
            assert 0 < record.ttft <= record.wall_time and record.rounds >= 1 and result.rounds == []
            lengths.clear()
    finally:
        hook.remove()
    # gamma = 3 held fixed: every verification covers gamma + 1 tokens (but the last two of a call,
    # which the max_new_tokens budget shortens); a heuristic schedule would grow it, a confidence
    # threshold or the draft model's default EOS (2, emitted here) would cut it
    for call in verify:
        assert len(call) > 5 and set(call[:-2]) == {4} and max(call) == 4, call
    assert {k: getattr(draft.generation_config, k, None) for k in before} == before  # restored


def test_hf_assisted_rejects_batches_and_maps_sampling(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="batch size 1"):
        hf_assisted_decode(target, draft, [[1, 2], [3, 4]], 2, PLAIN, 4, set(), 0, PhaseTimer())
    with pytest.raises(ValueError, match="needs a draft model"):
        hf_assisted_decode(target, None, [[1, 2]], 2, PLAIN, 4, set(), 0, PhaseTimer())
    # transformers fills an omitted top_k with its global default 50: it must be passed explicitly
    config, _ = target._prepare_generation_config(None, **generate_kwargs(PLAIN, 4, set()))
    assert not config.top_k and config.top_p == 1.0 and config.temperature == 1.0  # 0 / None: no top-k filter
    assert config.eos_token_id is None  # no EOS at all, not the model's default
    config, _ = target._prepare_generation_config(None, **generate_kwargs(TOPK, 4, {2}))
    assert config.top_k == 5 and config.eos_token_id == [2]


def test_hf_assisted_sampling_passes_a_small_exact_audit(pair, cache):
    target, draft = pair
    settings = AuditSettings(samples=300, tokens=3)
    decoder = hf_assisted_decoder(target, draft, 2, TOPK, set())
    result = run_audit(target, decoder, [TINY_PROMPTS[0]], TOPK, set(), settings, cache=cache)
    row = result.summary.iloc[0]
    assert row.decoder == "hf_assisted" and row.reference == "exact" and row.verdict == "pass"


# ----------------------------------------------------------------------------- CLI


def test_cli_writes_report_and_gates_on_failure(tmp_path, capsys):
    common = ["--pair", "tiny", "--top-k", "5", "--samples", "1500", "--threads", "1"]
    assert main([*common, "--decoder", "speculative", "--out", str(tmp_path / "ok")]) == 0
    assert main([*common, "--decoder", "speculative", "--decoder", "broken:raw_q", "--out", str(tmp_path / "bad")]) == 1
    md = (tmp_path / "bad" / "audit.md").read_text()
    assert "broken:raw_q" in md and "**FAIL**" in md and "| pass |" in md
    import pandas as pd

    table = pd.read_csv(tmp_path / "bad" / "audit.csv")
    assert list(table["verdict"]) == ["pass", "FAIL"]
    assert {"p_value", "tv", "tv_lo", "tv_hi", "detectable_tv", "samples"} <= set(table.columns)
    with pytest.raises(SystemExit):
        main(["--decoder", "speculative", "--tokens", "2"])


def test_cli_processor_flags(tmp_path, capsys):
    common = [
        "--pair",
        "tiny",
        "--top-k",
        "5",
        "--samples",
        "1500",
        "--threads",
        "1",
        "--repetition-penalty",
        "1.5",
        "--banned-token-ids",
        "3,8",
        "--banned-sequences",
        "1,2;4,5,6",
        "--min-p",
        "0.05",
    ]
    out = tmp_path / "pen"
    assert (
        main([*common, "--decoder", "speculative", "--decoder", "broken:penalty_committed_only", "--out", str(out)])
        == 1
    )
    import pandas as pd

    table = pd.read_csv(out / "audit.csv")
    assert list(table["verdict"]) == ["pass", "FAIL"]
    assert table["sampling"][0] == (
        "T=1 top_k=5 min_p=0.05 repetition_penalty=1.5 banned_token_ids=[3,8] banned_sequences=[[1,2],[4,5,6]]"
    )
    for bad in (
        ["--repetition-penalty", "0"],
        ["--min-p", "2"],
        ["--banned-token-ids", "a,b"],
        ["--frequency-penalty", "3"],
    ):
        with pytest.raises(SystemExit):
            main(["--decoder", "speculative", *bad])


# ----------------------------------------------------------------------------- false alarms


@pytest.mark.slow
def test_false_alarm_rate_of_the_correct_decoder(pair):
    """Correct decoder, default settings, 100 seeds: at alpha = 0.01 expect about 1 false alarm.

    P(>= 5 of 100 | rate 1%) < 0.4%, so this fails only if the rate is really above 1%.
    scripts/audit_false_alarms.py runs more seeds.
    """
    target, draft = pair
    cache, fails = {}, 0
    for seed in range(100):
        settings = AuditSettings(seed=seed, bootstrap=0)
        decoder = speculative_decoder(target, draft, 2, TOPK, set(), settings.batch_size)
        result = run_audit(target, decoder, [list(p) for p in TINY_PROMPTS], TOPK, set(), settings, cache=cache)
        fails += not result.passed
    assert fails <= 4

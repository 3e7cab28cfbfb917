"""The statistical audit of every draft-length policy on the tiny pair at T = 1 (issue 38): prune_naive FAILs."""

from __future__ import annotations

import pytest
import torch

from specbench.audit import AuditSettings, make_decoder, run_audit, tiny_pair
from specbench.audit.names import check_decoder_name
from specbench.audit.pairs import TINY_PROMPTS
from specbench.decoding.sampling import SamplingConfig

PLAIN = SamplingConfig(temperature=1.0)
# tau = 0.2 drops about half of the tiny pair's drafts at T = 1 (q(x_i) quartiles 0.07 / 0.21 / 0.36)
DECODERS = {
    "policy:confidence_stop@0.2": "pass",
    "policy:schedule": "pass",
    "policy:prune_renormalized@0.2": "pass",
    "policy:prune_naive@0.2": "FAIL",
}


@pytest.fixture(scope="module")
def pair():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_pair()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cache():
    return {}


@pytest.mark.parametrize("name,verdict", DECODERS.items())
def test_every_policy_on_the_tiny_pair_at_t1(name, verdict, pair, cache):
    target, draft = pair
    settings = AuditSettings()
    decoder = make_decoder(name, target, draft, 2, PLAIN, set(), settings)
    row = run_audit(target, decoder, [list(p) for p in TINY_PROMPTS], PLAIN, set(), settings, cache=cache).summary
    row = row.iloc[0]
    assert row.verdict == verdict, (name, row.p_value, row.tv)
    if verdict == "FAIL":
        assert row.p_value < 1e-6 and row.tv_lo > row.tv_null


def test_policy_decoder_names_are_checked():
    with pytest.raises(ValueError, match=r"audit.decoder policy='nope': must be one of"):
        check_decoder_name("policy:nope")
    with pytest.raises(ValueError, match=r"tau '2' must be a probability"):
        check_decoder_name("policy:prune_naive@2")


def test_transformers_confidence_threshold_is_audited(pair, cache):
    """transformers' own policy (assistant_confidence_threshold > 0, which keeps the token and then stops) at
    T = 1 passes a small exact audit; the threshold is applied (fewer assistant forwards)."""
    from specbench.audit.decoders import hf_assisted_decoder

    target, draft = pair
    calls = [0]
    hook = draft.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        counts = []
        for threshold in (0.0, 0.2):
            calls[0] = 0
            decoder = hf_assisted_decoder(target, draft, 4, PLAIN, set(), threshold)
            decoder.sample(TINY_PROMPTS[0], 10, 8, 0)
            counts.append(calls[0])
    finally:
        hook.remove()
    assert counts[1] < counts[0]
    decoder = hf_assisted_decoder(target, draft, 2, PLAIN, set(), 0.2)
    settings = AuditSettings(samples=300, tokens=3)
    row = run_audit(target, decoder, [TINY_PROMPTS[0]], PLAIN, set(), settings, cache=cache).summary.iloc[0]
    assert row.decoder == "hf_assisted@0.2" and row.verdict == "pass"

"""The decoder on tiny float64 models: greedy equality, cache invariant, ragged rows, EOS."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, hf_greedy, tiny_llama
from transformers import DynamicCache
from transformers.generation.logits_process import TopKLogitsWarper

from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.drafts import ModelDraft, NgramDraft
from specbench.decoding.hf_assisted import hf_assisted_decode
from specbench.decoding.kvcache import CachedLM, with_cache
from specbench.decoding.sampling import SamplingConfig, TokenContext
from specbench.decoding.static_kv import StaticLM
from specbench.decoding.timing import PhaseTimer
from specbench.models.quant import quantize_w4a16, quantize_w8a16

GREEDY = SamplingConfig()


def make_draft(kind, target, close_draft):
    if kind == "model":
        return ModelDraft(close_draft)
    if kind == "w8a16":
        return ModelDraft(quantize_w8a16(target), name="w8a16")
    if kind == "w4a16":
        return ModelDraft(quantize_w4a16(target), name="w4a16")
    if kind == "w4a16h8":
        return ModelDraft(quantize_w4a16(target, head="int8"), name="w4a16h8")
    if kind == "ngram":
        return NgramDraft(VOCAB)
    if kind == "unrelated":
        return ModelDraft(tiny_llama(5, layers=1))
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["model", "w8a16", "w4a16", "w4a16h8", "ngram", "unrelated"])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_equals_target_generate(kind, batch, target, close_draft, prompts):
    ps = prompts[:batch]
    result = speculative_decode(CachedLM(target), make_draft(kind, target, close_draft), ps, 4, GREEDY, 24, set())
    for row, prompt in enumerate(ps):
        assert result.tokens[row] == hf_greedy(target, prompt, 24), f"row {row}"
    accepted = [r.accepted for r in result.rounds]
    if kind == "model" and batch == 4:  # a close draft: ragged acceptance within rounds
        per_round = {}
        for r in result.rounds:
            per_round.setdefault(r.round, set()).add(r.accepted)
        assert any(len(v) > 1 for v in per_round.values()), "expected rows to accept different counts"
        assert 0 < sum(accepted) < 4 * len(accepted)


def test_autoregressive_baseline_equals_generate(target, prompts):
    result = autoregressive_decode(CachedLM(target), prompts, GREEDY, 20, set())
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == hf_greedy(target, prompt, 20)


def _fresh_kv(model, tokens: list[int], layer: int):
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([tokens]), **with_cache(model, cache), use_cache=True)
    return cache.layers[layer].keys[0], cache.layers[layer].values[0]


@pytest.mark.parametrize("path", ["eager", "static"])
@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(temperature=1.0, top_k=20)])
def test_cache_invariant_after_every_round(sampling, path, target, close_draft, prompts):
    """Each row's valid target/draft cache columns equal a fresh prefill of its committed tokens, on the
    reference cache and on the fast path's (where rows that finished early keep their slots, idle)."""
    make = CachedLM if path == "eager" else (lambda model: StaticLM(model, 64))
    target_lm = make(target)
    draft = ModelDraft(close_draft, lm=make(close_draft))
    checked = []

    def check(seqs, rows):
        target_lm.check_mirrors()
        for i, seq in enumerate(seqs):
            # Target cache holds every committed token but the newest (fed next round).
            for layer in (0, 1):
                k, v = target_lm.row_kv(i, layer)
                fk, fv = _fresh_kv(target, seq[:-1], layer)
                assert k.shape == fk.shape, (k.shape, fk.shape)
                torch.testing.assert_close(k, fk, rtol=1e-9, atol=1e-9)
                torch.testing.assert_close(v, fv, rtol=1e-9, atol=1e-9)
            # Draft cache: a prefix of the committed tokens, missing only the last one or two.
            dk, _ = draft.lm.row_kv(i, 0)
            n = dk.shape[1]
            assert len(seq) - 2 <= n <= len(seq) - 1
            torch.testing.assert_close(dk, _fresh_kv(close_draft, seq[:n], 0)[0], rtol=1e-9, atol=1e-9)
        checked.append(len(seqs))

    g = torch.Generator().manual_seed(0)
    speculative_decode(target_lm, draft, prompts, 3, sampling, 20, {5}, g, on_round=check)  # EOS 5: ragged ends
    assert len(checked) >= 5


def test_eos_and_max_new_tokens_per_row(target, prompts):
    reference = [hf_greedy(target, p, 16) for p in prompts]
    eos = reference[1][5]  # row 1 stops at its 6th token; other rows may stop earlier too
    result = speculative_decode(CachedLM(target), NgramDraft(VOCAB), prompts, 3, GREEDY, 16, {eos})
    for row, ref in enumerate(reference):
        cut = ref.index(eos) + 1 if eos in ref else 16
        assert result.tokens[row] == ref[:cut]
    by_row = {r.row: r for r in result.requests}
    assert by_row[1].finished_by == "eos" and by_row[1].new_tokens == 6
    assert all(r.new_tokens <= 16 for r in result.requests)
    # Finished rows stop costing work: later rounds run on fewer rows.
    assert min(r.n_active for r in result.rounds) < len(prompts)


@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_greedy_form_decodes_what_the_general_rule_decodes(kind, target, close_draft, prompts):
    """Under greedy the decoder takes `GREEDY_FORMS`; a rule outside it runs on p and q: same rounds, same tokens."""
    from specbench.decoding.acceptance import rejection_sample

    def general(*args, **kwargs):  # the same rule, not registered: the decoder builds p and runs it
        return rejection_sample(*args, **kwargs)

    runs = [
        speculative_decode(
            CachedLM(target), make_draft(kind, target, close_draft), prompts, 4, GREEDY, 24, set(), rule=rule
        )
        for rule in (rejection_sample, general)
    ]
    assert runs[0].tokens == runs[1].tokens
    outcomes = [[(r.row, r.accepted, r.extra, r.committed) for r in run.rounds] for run in runs]
    assert outcomes[0] == outcomes[1]
    assert len({r.accepted for r in runs[0].rounds}) > 1  # rejections and acceptances both happened


@pytest.mark.parametrize("kind", ["model", "w8a16", "ngram"])
@pytest.mark.parametrize(
    "sampling",
    [GREEDY, SamplingConfig(repetition_penalty=1.3, banned_token_ids=(3,)), SamplingConfig(0.8, top_k=20)],
    ids=["greedy", "greedy_penalized", "sampled"],
)
def test_propose_without_q_gives_the_same_drafts(kind, sampling, target, close_draft, prompts):
    """`with_q=False` (the greedy form's call) builds no q, and proposes the drafts `with_q=True` does,
    from the same draws, round after round of the same commits."""
    drafts = [make_draft(kind, target, close_draft) for _ in range(2)]
    generators = [torch.Generator().manual_seed(7) for _ in range(2)]
    seqs = [list(p) + [p[-1]] for p in prompts]  # the prompt and a first new token
    for d in drafts:
        d.prefill(seqs)
    for _ in range(4):
        context = TokenContext.build(
            sampling, seqs, [len(p) for p in prompts], VOCAB, "cpu"
        )  # as the decoder builds it
        (with_q, q), (without_q, none) = (
            d.propose(seqs, 3, sampling, g, context, with_q=flag)
            for d, g, flag in zip(drafts, generators, (True, False))
        )
        assert none is None and q.shape == (len(seqs), 3, VOCAB)
        assert torch.equal(with_q, without_q)
        accepted = torch.tensor([i % 4 for i in range(len(seqs))])  # every count 0..gamma over the rows
        for d in drafts:
            d.commit(accepted, accepted.tolist())
        for i, row in enumerate(seqs):
            row.extend(with_q[i, : accepted[i]].tolist() + [5])
    assert torch.equal(generators[0].get_state(), generators[1].get_state())


def test_records_are_raw_and_consistent(target, close_draft, prompts):
    result = speculative_decode(CachedLM(target), ModelDraft(close_draft), prompts, 4, GREEDY, 20, set())
    for r in result.rounds:
        assert 0 <= r.accepted <= r.gamma == 4
        assert r.extra == ("bonus" if r.accepted == 4 else "recovered")
        assert 1 <= r.committed <= r.accepted + 1
        assert r.t_draft >= 0 and r.t_verify > 0 and r.t_round >= r.t_draft + r.t_verify
        assert abs(r.t_overhead - (r.t_round - r.t_draft - r.t_verify)) < 1e-12
    for req in result.requests:
        rows = [r for r in result.rounds if r.row == req.row]
        assert req.new_tokens == 1 + sum(r.committed for r in rows) == len(result.tokens[req.row])
        assert req.rounds == len(rows) and 0 < req.ttft <= req.wall_time


def test_sampling_is_reproducible_with_a_seed(target, close_draft, prompts):
    sampling = SamplingConfig(temperature=0.8, top_p=0.9)
    runs = [
        speculative_decode(
            CachedLM(target),
            ModelDraft(close_draft),
            prompts,
            3,
            sampling,
            16,
            set(),
            torch.Generator().manual_seed(42),
        ).tokens
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    other = speculative_decode(
        CachedLM(target), ModelDraft(close_draft), prompts, 3, sampling, 16, set(), torch.Generator().manual_seed(43)
    ).tokens
    assert other != runs[0]


def test_gamma_must_be_positive(target, prompts):
    with pytest.raises(ValueError, match=r"gamma=0: must be an integer >= 1"):
        speculative_decode(CachedLM(target), NgramDraft(VOCAB), prompts, 0, GREEDY, 8, set())


def test_ngram_lookup_continues_the_latest_match():
    draft = NgramDraft(50, max_ngram=2)
    assert draft.lookup([1, 2, 3, 4, 9, 2, 3, 7, 8, 2, 3], 3) == [7, 8, 2]
    assert draft.lookup([5, 6, 7], 2) == [7, 7]  # no match: repeat the last token
    assert draft.lookup([1, 2, 1], 4) == [2, 1, 1, 1]  # short continuation padded


def test_compaction_keeps_the_committed_kv(target):
    """Holes from ragged rollbacks are squeezed out without changing any row's KV."""
    lm = CachedLM(target)
    seqs = [[1, 2, 3], [4, 5, 6, 7, 8]]
    lm.prefill(seqs)
    g = torch.Generator().manual_seed(0)
    for keep in ([1, 3], [2, 1], [4, 2]):
        fed = torch.randint(0, VOCAB, (2, 4), generator=g)
        lm.feed(fed)
        lm.keep_last_fed(4, torch.tensor(keep))
        for row in range(2):
            seqs[row] += fed[row, : keep[row]].tolist()
    assert lm.mask.shape[1] > int(lm.n_valid.max())  # there are holes to squeeze
    lm._compact()
    assert lm.mask.shape[1] == int(lm.n_valid.max())
    for row in range(2):
        k, v = lm.row_kv(row, 1)
        fk, fv = _fresh_kv(target, seqs[row], 1)
        torch.testing.assert_close(k, fk, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(v, fv, rtol=1e-9, atol=1e-9)
    # And decoding continues exactly: next-token logits equal a fresh forward's.
    nxt = torch.tensor([[9], [10]])
    logits = lm.feed(nxt)[:, -1]
    for row in range(2):
        with torch.inference_mode():
            ref = target(input_ids=torch.tensor([seqs[row] + [nxt[row, 0].item()]])).logits[0, -1]
        torch.testing.assert_close(logits[row], ref, rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------- TTFT, one definition for every decoder


class ForwardClock(PhaseTimer):
    """Instrumentation: a timer whose 'seconds' count model forwards (1000 per target forward, 1 per draft forward)."""

    def __init__(self, target, draft) -> None:
        super().__init__("cpu")
        self.now = 0
        self.hooks = [
            target.register_forward_pre_hook(lambda *_: self._tick(1000)),
            draft.register_forward_pre_hook(lambda *_: self._tick(1)),
        ]

    def _tick(self, n: int) -> None:
        self.now += n

    def mark(self) -> int:
        self._marks.append(float(self.now))
        return len(self._marks) - 1

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()


def _first_round_tokens(target, draft, prompt: list[int], gamma: int) -> int:
    """Tokens of transformers' first greedy assisted round: the draft's matching prefix + 1."""
    ref, drafted = hf_greedy(target, prompt, gamma), hf_greedy(draft, prompt, gamma)
    matched = next((i for i, (a, b) in enumerate(zip(ref, drafted)) if a != b), gamma)
    return matched + 1


@pytest.mark.parametrize("decoder", ["speculative", "autoregressive", "hf_assisted"])
def test_ttft_ends_when_the_first_token_is_available(decoder, target, close_draft, prompts):
    """TTFT is measured from the call to the first committed token(s), on one clock for every decoder:
    specbench's decoders need the target's prefill only (the draft prefills afterwards), transformers'
    assisted generation delivers its first round (gamma drafts, one verify) as its first chunk."""
    gamma = 3
    prompt = next(p for p in prompts if _first_round_tokens(target, close_draft, p, gamma) > 1)
    clock = ForwardClock(target, close_draft)
    try:
        if decoder == "speculative":
            result = speculative_decode(
                CachedLM(target), ModelDraft(close_draft), [prompt], gamma, GREEDY, 12, set(), timer=clock
            )
        elif decoder == "autoregressive":
            result = autoregressive_decode(CachedLM(target), [prompt], GREEDY, 12, set(), timer=clock)
        else:
            result = hf_assisted_decode(target, close_draft, [prompt], gamma, GREEDY, 12, set(), 0, clock)
    finally:
        clock.remove()
    record = result.requests[0]
    target_forwards, draft_forwards = divmod(round(record.ttft), 1000)
    assert target_forwards == 1, record  # the first token(s) come out of the target's first forward
    if decoder == "hf_assisted":
        assert draft_forwards == gamma, record
        assert record.first_chunk_tokens == _first_round_tokens(target, close_draft, prompt, gamma) > 1
    else:
        assert draft_forwards == 0, record  # no draft work before the user has the first token
        assert record.first_chunk_tokens == 1
    assert record.wall_time > record.ttft and record.new_tokens == 12


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_p=0.9)])
def test_hf_assisted_draft_gets_no_hidden_top_k(sampling, target, close_draft, prompts, monkeypatch):
    """With top_k=0 neither transformers' target nor its assistant builds a top-k filter (it used to fill 50)."""
    built = []
    init = TopKLogitsWarper.__init__

    def counting_init(self, top_k, *args, **kwargs):
        built.append(top_k)
        init(self, top_k, *args, **kwargs)

    monkeypatch.setattr(TopKLogitsWarper, "__init__", counting_init)
    before = close_draft.generation_config.to_dict()
    hf_assisted_decode(target, close_draft, [prompts[0]], 3, sampling, 8, set(), 0, PhaseTimer())
    assert built == []
    assert close_draft.generation_config.to_dict() == before  # the assistant's settings are restored
    hf_assisted_decode(
        target, close_draft, [prompts[0]], 3, SamplingConfig(temperature=1.0, top_k=5), 8, set(), 0, PhaseTimer()
    )
    assert built and set(built) == {5}  # a requested top-k reaches p and q alike

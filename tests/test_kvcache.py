"""CachedLM beyond plain Llama: sliding-window attention (all layers or mixed with full ones) and prefill logits."""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import VOCAB, hf_greedy, perturbed, tiny_llama
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.drafts import ModelDraft
from specbench.decoding.kvcache import CachedLM, attention_windows
from specbench.decoding.sampling import SamplingConfig
from specbench.decoding.static_kv import StaticLM

WINDOW = 8
MIXED = ["sliding_attention", "full_attention", "sliding_attention"]


def tiny_sliding(kind: str, seed: int = 0):
    """A random float64 model whose window (8) is far shorter than the contexts decoded here (>= 32)."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,
        sliding_window=WINDOW,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    if kind == "mistral":  # every layer slides (no layer_types)
        model = MistralForCausalLM(MistralConfig(**common))
    elif kind == "qwen2":  # sliding and full layers mixed, SDPA: one bool mask per layer type
        model = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=True, max_window_layers=0, layer_types=MIXED, **common))
    elif kind == "gemma2":  # mixed, eager attention: one additive mask per layer type
        # Gemma scales embeddings by sqrt(hidden): a smaller init keeps its output from repeating one token.
        model = Gemma2ForCausalLM(Gemma2Config(head_dim=8, layer_types=MIXED, **{**common, "initializer_range": 0.05}))
    else:
        raise AssertionError(kind)
    return model.to(torch.float64).eval()


@pytest.fixture(scope="module", params=["mistral", "qwen2", "gemma2"])
def sliding_pair(request):
    model = tiny_sliding(request.param)
    return model, perturbed(model, 0.05, seed=1)  # a close draft: some rounds accept, most reject


@pytest.fixture(scope="module")
def long_prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (33, 20, 40, 9)]


def test_the_tiny_models_really_mix_window_kinds(sliding_pair):
    windows = attention_windows(sliding_pair[0].config)
    kind = type(sliding_pair[0]).__name__
    assert windows == (
        {"sliding_attention": WINDOW}
        if kind.startswith("Mistral")
        else {"sliding_attention": WINDOW, "full_attention": None}
    ), windows


@pytest.mark.parametrize("batch", [1, 4])
def test_sliding_window_baseline_equals_generate(batch, sliding_pair, long_prompts):
    model, _ = sliding_pair
    ps = long_prompts[:batch]
    result = autoregressive_decode(CachedLM(model), ps, SamplingConfig(), 28, set())
    for row, prompt in enumerate(ps):
        assert result.tokens[row] == hf_greedy(model, prompt, 28), f"row {row}"


@pytest.mark.parametrize("batch", [1, 4])
def test_sliding_window_speculative_equals_generate_through_rejections(batch, sliding_pair, long_prompts):
    """Rejected drafts leave holes in both caches: the window must count each row's tokens, not columns."""
    model, draft = sliding_pair
    ps = long_prompts[:batch]
    result = speculative_decode(CachedLM(model), ModelDraft(draft), ps, 4, SamplingConfig(), 28, set())
    for row, prompt in enumerate(ps):
        assert result.tokens[row] == hf_greedy(model, prompt, 28), f"row {row}"
    accepted = [r.accepted for r in result.rounds]
    assert min(accepted) < 4 and max(accepted) > 0, accepted  # rejections (holes) and acceptances both happened


def test_logits_after_holes_equal_a_plain_forward(sliding_pair):
    """Ragged rollbacks, then compaction: every row's next logits equal a fresh forward's."""
    model, _ = sliding_pair
    lm = CachedLM(model)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (20, 33)]
    lm.prefill(seqs)
    for i, keep in enumerate(([1, 3], [2, 0], [4, 2], [0, 1], [3, 3], [1, 4])):
        fed = torch.randint(0, VOCAB, (2, 4), generator=g)
        lm.feed(fed)
        lm.keep_last_fed(4, torch.tensor(keep))
        for row in range(2):
            seqs[row] += fed[row, : keep[row]].tolist()
        if i == 3:
            assert lm.mask.shape[1] > int(lm.n_valid.max())  # holes inside the window
        lm.check_mirrors()
    nxt = torch.tensor([[9, 3], [10, 4]])
    logits = lm.feed(nxt)  # [2, 2, V]
    for row in range(2):
        with torch.inference_mode():
            ref = model(input_ids=torch.tensor([seqs[row] + nxt[row].tolist()])).logits[0, -2:]
        # Gemma2's eager attention takes its softmax in float32, whatever the model dtype.
        torch.testing.assert_close(logits[row], ref, rtol=1e-5, atol=1e-5)


def test_unsupported_attention_layouts_are_refused():
    model = tiny_sliding("mistral")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match=r"_attn_implementation='flash_attention_2': sliding-window layers need one"):
        CachedLM(model)
    chunked = Qwen2Config(layer_types=["chunked_attention", "full_attention"], num_hidden_layers=2)
    with pytest.raises(ValueError, match=r"layer_types\[0\]='chunked_attention': .* supports only"):
        attention_windows(chunked)
    with pytest.raises(ValueError, match=r"attention_chunk_size=4: .* supports only full and sliding"):
        attention_windows(LlamaConfig(num_hidden_layers=2, attention_chunk_size=4))


# ----------------------------------------------------------------------------- prefill logits


def test_prefill_computes_logits_for_the_last_position_only(target, close_draft, prompts):
    """The lm_head sees one position per prompt (target and draft); the last logits are unchanged."""
    rows = []
    hooks = [
        m.lm_head.register_forward_hook(lambda mod, args, out: rows.append(out.shape[-2]))
        for m in (target, close_draft)
    ]
    try:
        logits = CachedLM(target).prefill(prompts)  # [B, V]
        assert rows == [1] * len(prompts), rows
        rows.clear()
        ModelDraft(close_draft).prefill([p + [0] for p in prompts])
        assert rows == [1] * len(prompts), rows
    finally:
        for hook in hooks:
            hook.remove()
    for row, prompt in enumerate(prompts):
        with torch.inference_mode():
            ref = target(input_ids=torch.tensor([prompt])).logits[0, -1]
        torch.testing.assert_close(logits[row], ref, rtol=1e-12, atol=1e-12)


BASE_CACHE_KEYWORD = "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


class PastKeyValuesLlama(LlamaForCausalLM):
    """transformers < 5.24's forward: the cache is `past_key_values`, and an unknown keyword is dropped."""

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None, **kwargs
    ):
        keep = kwargs.get("logits_to_keep", 0)
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{BASE_CACHE_KEYWORD: past_key_values},
            use_cache=use_cache,
            logits_to_keep=keep,
        )


@pytest.mark.parametrize("lm_kind", ["eager", "static"])
def test_caches_reach_a_forward_that_names_them_past_key_values(lm_kind, prompts):
    """The GPU image's transformers (5.17) calls the cache `past_key_values`: both KV caches must hand theirs
    over by that name there, or the model silently runs without it (incremental logits != a full forward)."""
    base = tiny_llama(0)
    model = PastKeyValuesLlama(base.config).to(torch.float64).eval()
    model.load_state_dict(base.state_dict())
    lm = CachedLM(model) if lm_kind == "eager" else StaticLM(model, capacity=64)
    ids = prompts[1]
    with torch.inference_mode():
        lm.prefill([ids[:3]])
        inc = lm.feed(torch.tensor([ids[3:]]))[0]
        full = base(input_ids=torch.tensor([ids])).logits[0, 3:]
    torch.testing.assert_close(inc, full)

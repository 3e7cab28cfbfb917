"""The audit's model pairs: a tiny float64 toy pair (exact mode) and the embedded SmolLM2 pair."""

from __future__ import annotations

import copy

import torch
from transformers import PreTrainedModel

TINY_PROMPTS = [[3, 7, 11], [5, 2, 9, 14]]
EMBEDDED_PROMPTS = ["The capital of France is", "My favourite colour is"]
AUDIT_PROMPTS = {"tiny": TINY_PROMPTS, "embedded": EMBEDDED_PROMPTS}  # the built-in prompts of each --pair


def tiny_pair(
    vocab_size: int = 16, init_std: float = 0.3, draft_noise: float = 0.1, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedModel]:
    """A float64 toy target (random tiny Llama, vocab 16) and a draft = target with perturbed weights.

    init_std 0.3 (not 0.02) makes p far from uniform and strongly dependent on the last
    token; weight noise of 0.1 x each matrix's std gives an acceptance rate of about 0.7
    at T=1 (0.65-0.75 with top-k 5), so every broken variant changes the output noticeably.
    """
    from specbench.models.shapes import build_shape_only_model, shape_config

    config = shape_config(
        "tiny-llama",
        vocab_size=vocab_size,
        initializer_range=init_std,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    target = build_shape_only_model(config, dtype=torch.float64, seed=seed)
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in draft.parameters():
            if param.dim() >= 2:
                param.add_(torch.randn(param.shape, generator=g, dtype=param.dtype) * draft_noise * param.std())
    return target, draft


def load_audit_pair(name: str) -> tuple[PreTrainedModel, PreTrainedModel, list[list[int]], set[int]]:
    """(target, draft, prompts, eos ids) for `--pair tiny|embedded`."""
    if name == "tiny":
        target, draft = tiny_pair()
        return target, draft, [list(p) for p in TINY_PROMPTS], set()
    if name == "embedded":
        from specbench.models.loading import eos_ids, load_model
        from specbench.models.quant import quantize_w8a16

        target, tokenizer = load_model("embedded", dtype="float32")
        prompts = [tokenizer(t)["input_ids"] for t in EMBEDDED_PROMPTS]
        return target, quantize_w8a16(target), prompts, eos_ids(tokenizer, target)
    raise ValueError(f"audit.pair={name!r}: must be one of ['tiny', 'embedded']")

"""The fast path's rotary table: the model's own cos and sin bit for bit, installed on a compiled StaticLM's copy
only, for fixed frequencies only; and a compiled step that evaluates no trig function."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import tiny_llama
from torch import nn
from torch._inductor.utils import run_and_get_code
from transformers import LlamaConfig, LlamaForCausalLM

from specbench.decoding.rotary import TableRotary, tabulate_rotary
from specbench.decoding.static_kv import StaticLM


def llama_with_rope(rope_parameters: dict) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_parameters=rope_parameters,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "rope_theta": 500000.0, "factor": 4.0},
        {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0, "original_max_position_embeddings": 64},
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_table_gives_the_models_own_cos_and_sin_bit_for_bit(rope, dtype):
    rotary = llama_with_rope(rope).model.rotary_emb
    table = TableRotary(rotary, 300)
    g = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 300, (3, 7), generator=g)
    x = torch.empty(0, dtype=dtype)
    for want, got in zip(rotary(x, positions), table(x, positions)):
        assert got.dtype == want.dtype == dtype and got.shape == want.shape == (3, 7, 8)
        assert torch.equal(got, want)
    model = llama_with_rope(rope).to(dtype)  # and the check before installing one agrees, in the model's dtype
    assert tabulate_rotary(model, 300) == 1 and isinstance(model.model.rotary_emb, TableRotary)


def test_length_dependent_frequencies_keep_their_embedding():
    model = llama_with_rope({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    assert tabulate_rotary(model, 128) == 0
    assert not isinstance(model.model.rotary_emb, TableRotary)


class Float32Rotary(nn.Module):
    """As some transformers models' rotary embeddings do: float32 cos and sin whatever x's dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8), persistent=False)
        self.attention_scaling = 1.0

    def forward(self, x, position_ids):
        emb = (position_ids[..., None].float() * self.inv_freq).repeat(1, 1, 2)
        return emb.cos(), emb.sin()


class ComplexRotary(Float32Rotary):
    """As Llama 4's and DeepSeek-V2's: one complex tensor, not a (cos, sin) pair."""

    def forward(self, x, position_ids):
        angles = position_ids[..., None].float() * self.inv_freq
        return torch.polar(torch.ones_like(angles), angles)


@pytest.mark.parametrize("rotary", [Float32Rotary, ComplexRotary])
def test_an_embedding_the_table_would_not_reproduce_is_left_as_it_is(rotary):
    model = nn.Sequential(nn.Linear(4, 4).to(torch.bfloat16))
    model.rotary_emb = rotary()
    assert tabulate_rotary(model, 32) == 0
    assert type(model.rotary_emb) is rotary


def test_a_compiled_static_lm_tabulates_its_copy_and_leaves_the_callers_model_alone():
    model = tiny_llama(3, dtype=torch.float32)
    lm = StaticLM(model, 64, compile_mode="default")
    assert isinstance(lm.model.model.rotary_emb, TableRotary)
    assert lm.model.model.rotary_emb.cos.shape == (64, 8)
    assert not isinstance(model.model.rotary_emb, TableRotary)  # the caller's model is not touched
    assert not isinstance(StaticLM(model, 64).model.model.rotary_emb, TableRotary)  # eager static path: as it is


def test_a_compiled_step_evaluates_no_trig_function():
    """Inductor inlined the rotary embedding's cos and sin into every layer's use of them, so a compiled step
    evaluated them once per element of q and k in each layer. Seen failing before `rotary.tabulate_rotary`: the
    generated code called cos and sin."""
    model = tiny_llama(4, dtype=torch.float32)
    lm = StaticLM(model, 64, compile_mode="default")
    lm.prefill([[1, 2, 3, 4]])
    with torch.inference_mode():
        _, code = run_and_get_code(lm.feed, torch.tensor([[5, 6, 7]]))
    text = "\n".join(code)
    assert text, "inductor generated no code: the step was not compiled here"
    assert not re.findall(r"(?:std::|Sleef_|\.)(?:cos|sin)\w*\(", text)

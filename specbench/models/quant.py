"""Weight-only int8 (W8A16) copies of a model: the self-draft for the embedded default.

Each nn.Linear becomes int8 weights with one scale per output channel; activations
stay in the model's float dtype. On CPU with bf16 activations the matmul runs in
torch's int8 weight kernel, so the copy reads half the bytes of the bf16 target.
"""

from __future__ import annotations

import copy
import functools

import torch
from torch import nn


class Int8Linear(nn.Module):
    """y = x @ (w_int8 * scale).T (+ bias), per-output-channel symmetric scales."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0  # [out]
        self.register_buffer("weight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        # torch's int8 kernel wins while memory-bound (few rows: decode steps); past ~12 rows
        # (prefill, big batches) dequantizing into one bf16 GEMM is faster (measured here).
        if flat.device.type == "cpu" and flat.dtype == torch.bfloat16 and flat.shape[0] <= 12:
            y = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scale)
        else:
            y = torch.nn.functional.linear(flat, self.weight.to(flat.dtype)) * self.scale.to(flat.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def quantize_w8a16(model: nn.Module) -> nn.Module:
    """A deep copy of `model` with every nn.Linear (lm_head included) in W8A16."""
    quantized = copy.deepcopy(model)
    for _name, module in list(quantized.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, Int8Linear(child))
    quantized.eval()
    return quantized


@functools.lru_cache(maxsize=2)
def quantize_w8a16_cached(model: nn.Module) -> nn.Module:
    """`quantize_w8a16`, once per loaded model per process (a sweep's jobs share the copy)."""
    return quantize_w8a16(model)

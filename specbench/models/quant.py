"""Weight-only int8 (W8A16) and int4 (W4A16) copies of a model: self-drafts of the target.

W8A16: each nn.Linear becomes int8 weights with one scale per output channel; on CPU with bf16
activations the matmul runs in torch's int8 weight kernel, so the copy reads half the bytes of
the bf16 target. W4A16: 4-bit weights with a scale and zero point per group of 32 input
channels, in torch's CPU int4 kernel: a quarter of the bytes. Activations stay in the model's
float dtype in both.
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


class Int4Linear(nn.Module):
    """y = x @ w4.T (+ bias): w = (q − 8)·scale + zero per group of `GROUP` input channels, q in 0..15."""

    GROUP = 32
    KERNEL_ROWS = 12  # like Int8Linear: the kernel's cost grows with the rows, a dequantized GEMM's does not
    KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        n, k, g = linear.out_features, linear.in_features, self.GROUP
        if k % g:
            raise ValueError(f"Int4Linear: in_features={k} is not a multiple of the group size {g}")
        w = linear.weight.detach().float().reshape(n, k // g, g)
        low, high = w.amin(-1), w.amax(-1)
        scale = ((high - low) / 15).clamp_min(1e-8)  # [n, k/g]
        q = torch.round((w - low[..., None]) / scale[..., None]).clamp(0, 15).reshape(n, k)
        # The GEMM path's copy of q, a plain attribute rather than a buffer: a decode step (the kernel)
        # never reads it, so it is not part of the weight bytes a step streams.
        self.unpacked = q.to(torch.uint8)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1))
        # [k/g, n, 2]: (scale, zero) as the kernel takes them; zero = low + 8·scale since q is offset by 8
        sz = torch.stack([scale, low + 8 * scale], -1).transpose(0, 1).contiguous()
        self.register_buffer("scales_zeros", sz.to(linear.weight.dtype))  # the activations' dtype: no cast per call
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = k, n

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight [out, in] the kernel multiplies by, in `dtype`."""
        n, k, g = self.out_features, self.in_features, self.GROUP
        sz = self.scales_zeros.transpose(0, 1)  # [n, k/g, 2]
        w = (self.unpacked.reshape(n, k // g, g).float() - 8) * sz[..., :1] + sz[..., 1:]
        return w.reshape(n, k).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if flat.device.type == "cpu" and flat.dtype in self.KERNEL_DTYPES and flat.shape[0] <= self.KERNEL_ROWS:
            sz = self.scales_zeros.to(flat.dtype)
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat.contiguous(), self.packed, self.GROUP, sz)
        else:
            y = torch.nn.functional.linear(flat, self.dequantized(flat.dtype))
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def _quantize(model: nn.Module, layer: type[nn.Module]) -> nn.Module:
    quantized = copy.deepcopy(model)
    for _name, module in list(quantized.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, layer(child))
    quantized.eval()
    return quantized


def quantize_w8a16(model: nn.Module) -> nn.Module:
    """A deep copy of `model` with every nn.Linear (lm_head included) in W8A16."""
    return _quantize(model, Int8Linear)


def quantize_w4a16(model: nn.Module) -> nn.Module:
    """A deep copy of `model` with every nn.Linear (lm_head included) in W4A16 (group size 32)."""
    return _quantize(model, Int4Linear)


@functools.lru_cache(maxsize=2)
def quantize_w8a16_cached(model: nn.Module) -> nn.Module:
    """`quantize_w8a16`, once per loaded model per process (a sweep's jobs share the copy)."""
    return quantize_w8a16(model)


@functools.lru_cache(maxsize=2)
def quantize_w4a16_cached(model: nn.Module) -> nn.Module:
    """`quantize_w4a16`, once per loaded model per process."""
    return quantize_w4a16(model)

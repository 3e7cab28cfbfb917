"""The fast path's attention: transformers' eager attention without materialising GQA-expanded keys.

Registered with transformers' `AttentionInterface` as `GROUPED`. Eager attention first copies each
key/value head once per query head of its group (`repeat_kv`); over a preallocated cache that is
the whole cache, every layer, every forward, and under `torch.compile` the scores matmul then packed
those copies into a GEMM template's layout as well (two thirds of a compiled verify step in the
profile). Here the query heads of a group become extra rows against their one key/value head: the
same scores, nothing copied (analysis/fast_path_one_copy_cpu_amx/). On CPU in float32 or bf16, where
specbench's kernels are loaded, a decode step or a verify (up to `cpu_matvec.MAX_QUERY_ROWS` query rows)
runs specbench's kernel for it (`cpu_matvec.cache_attention`); otherwise one query a row (a draft step,
a plain decode step) takes eager's form, which inductor fuses into two small reductions (that form's GEMM
of r rows is slower there), and more rows the grouped GEMM.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface

from specbench.models import cpu_matvec

GROUPED = "specbench_grouped"


def symbolic_columns(device: torch.device) -> bool:
    """Whether the fast path on this device attends to the columns its rows hold, a count that is a symbol
    of the compiled graph (CPU), rather than to the whole capacity, a constant (GPU: CUDA graphs need
    static shapes). `static_kv` sizes the columns by it; the attention below picks its form by it."""
    return device.type == "cpu"


def _accumulation(dtype: torch.dtype) -> torch.dtype:
    """The dtype a matmul of `dtype` accumulates in: fp32, or the dtype itself when wider."""
    return torch.promote_types(dtype, torch.float32)


def grouped_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """query [B, H, k, d], key/value [B, G, C, d] (H = G·r), additive mask [B, 1, k, C] or None;
    returns (output [B, k, H, d], weights [B, G, r·k, C]; [B, H, 1, C] at k = 1, None from the kernel), as
    transformers' attention functions do."""
    extras = {name: kwargs[name] for name in ("softcap", "s_aux") if kwargs.get(name) is not None}
    if extras:  # logit soft-capping (Gemma 2), attention sinks (gpt-oss): not in this form
        raise ValueError(
            f"{GROUPED} attention: {module.__class__.__name__} passes {sorted(extras)}, which it does not apply"
        )
    b, h, k, d = query.shape
    g, c = key.shape[1], key.shape[2]
    r = h // g  # query heads per key/value head: transformers orders them head = kv_head · r + i
    if cache_kernel(query, key, value, attention_mask, dropout if module.training else 0.0):
        # no weights, as transformers' SDPA form returns none
        return cpu_matvec.cache_attention(query, key, value, attention_mask, scaling), None  # [B, k, H, d]
    if k == 1:
        return _one_query(module, query.view(b, g, r, d), key, value, attention_mask, scaling, dropout)
    # With C a symbol of the compiled graph (`symbolic_columns`), bmm is ATen's, whose bf16 form is several
    # times slower than fp32 at these sizes (profiled on the AMX Xeon): so fp32, the dtype a matmul
    # accumulates in; and the fold is a copy always (a reshape would ask whether it is a view, a guard that
    # pins the graph to one C).
    symbolic = symbolic_columns(query.device)
    acc = _accumulation(query.dtype) if symbolic else query.dtype
    q = query.reshape(b * g, r * k, d).to(acc)  # [B·G, r·k, d]
    if symbolic:
        key, value = (x.to(acc, memory_format=torch.contiguous_format, copy=True) for x in (key, value))
    key, value = (x.reshape(b * g, c, d) for x in (key, value))  # [B·G, C, d]
    scores = torch.bmm(q, key.transpose(1, 2)) * scaling  # [B·G, r·k, C]
    if attention_mask is not None:
        scores = (scores.view(b, g, r, k, c) + attention_mask[:, :, None, :, :]).view(b * g, r * k, c)
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    out = torch.bmm(weights.to(acc), value).to(query.dtype)  # [B·G, r·k, d]
    return out.view(b, h, k, d).transpose(1, 2).contiguous(), weights.view(b, g, r * k, c)


def _one_query(
    module: nn.Module,
    q: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, G, r, d] (one query a row), key/value [B, G, C, d]: eager's products, written as broadcasts and
    sums (what inductor makes of eager's matmuls: two small reductions), so no GQA-expanded copy is reshaped
    and C may be a symbol of the compiled graph; sums in fp32 or wider, as a matmul accumulates. (output [B, 1, H, d],
    weights [B, H, 1, C])."""
    b, g, r, d = q.shape
    c = key.shape[2]
    acc = _accumulation(q.dtype)
    scores = (q[:, :, :, None].to(acc) * key[:, :, None].to(acc)).sum(-1) * scaling  # [B, G, r, C]
    if attention_mask is not None:  # [B, 1, 1, C]
        scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    out = (weights[..., None].to(acc) * value[:, :, None].to(acc)).sum(-2).to(q.dtype)  # [B, G, r, d]
    return out.view(b, 1, g * r, d), weights.view(b, g * r, 1, c)


def cache_kernel(
    q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, dropout: float
) -> bool:
    """Whether `cpu_matvec.cache_attention` runs this attention (q [B, H, k, d]): float32 or bf16 on CPU, at most
    `cpu_matvec.MAX_QUERY_ROWS` query rows (a decode step or a verify, not a prefill), a head dim it takes, one mask
    for all heads, no dropout, and specbench's kernels loaded (`StaticLM` loads them before it compiles: this check
    must not build them inside a traced forward). At one row the kernel beats inductor's fused form, most on long
    contexts: in float32 (analysis/fast_path_one_query_attention_cpu_amx_avx2/) and in bf16
    (analysis/fast_path_one_query_attention_bf16_cpu_amx/); at a verify's rows it replaces the bmm + softmax
    (analysis/fast_path_verify_attention_cpu_amx/)."""
    return (
        q.device.type == "cpu"
        and q.dtype == key.dtype == value.dtype
        and q.dtype in (torch.float32, torch.bfloat16)
        and q.shape[2] <= cpu_matvec.MAX_QUERY_ROWS
        and q.shape[-1] % 8 == 0
        and q.shape[-1] <= cpu_matvec.MAX_HEAD_DIM
        and (mask is None or (mask.dtype in (torch.float32, q.dtype) and mask.shape[:3] == (q.shape[0], 1, q.shape[2])))
        and dropout == 0.0
        and cpu_matvec.loaded()
    )


AttentionInterface.register(GROUPED, grouped_attention)

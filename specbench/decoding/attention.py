"""The fast path's attention: transformers' eager attention without materialising GQA-expanded keys.

Registered with transformers' `AttentionInterface` as `GROUPED`. Eager attention first copies each
key/value head once per query head of its group (`repeat_kv`); over a preallocated cache that is
the whole cache, every layer, every forward, and under `torch.compile` the scores matmul then packed
those copies into a GEMM template's layout as well (a k = 5 target step 30 ms on the AMX Xeon here,
20 ms of it attention). Here the query heads of a group become extra rows against their one
key/value head: the same scores, nothing copied. At one query a row (a draft step, a plain decode
step) that form's GEMM of r rows is slower than eager's broadcast (17.7 vs 14.7 ms a target step
there), so one query takes eager's form, which inductor fuses into two small reductions.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface

GROUPED = "specbench_grouped"


def grouped_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query [B, H, k, d], key/value [B, G, C, d] (H = G·r), additive mask [B, 1, k, C] or None;
    returns (output [B, k, H, d], weights [B, G, r·k, C]; [B, H, 1, C] at k = 1), as transformers' attention functions do."""
    extras = {name: kwargs[name] for name in ("softcap", "s_aux") if kwargs.get(name) is not None}
    if extras:  # logit soft-capping (Gemma 2), attention sinks (gpt-oss): not in this form
        raise ValueError(
            f"{GROUPED} attention: {module.__class__.__name__} passes {sorted(extras)}, which it does not apply"
        )
    b, h, k, d = query.shape
    g, c = key.shape[1], key.shape[2]
    r = h // g  # query heads per key/value head: transformers orders them head = kv_head · r + i
    if k == 1:  # eager's form (repeat_kv, per-head matmuls): under inductor, a broadcast reduction
        key = key[:, :, None].expand(b, g, r, c, d).reshape(b, h, c, d)  # [B, H, C, d]
        value = value[:, :, None].expand(b, g, r, c, d).reshape(b, h, c, d)
        g, r = h, 1
    q = query.reshape(b, g, r * k, d)  # [B, G, r·k, d]
    scores = torch.matmul(q, key.transpose(2, 3)) * scaling  # [B, G, r·k, C]
    if attention_mask is not None:
        scores = (scores.view(b, g, r, k, c) + attention_mask[:, :, None, :, :]).view(b, g, r * k, c)
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(weights, value)  # [B, G, r·k, d]
    return out.view(b, h, k, d).transpose(1, 2).contiguous(), weights


AttentionInterface.register(GROUPED, grouped_attention)

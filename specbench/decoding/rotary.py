"""A compiled forward's rotary embedding read from a table of every position's cos and sin.

transformers computes cos and sin of each position's angles once a forward, but inductor inlines that cheap
pointwise producer into every layer's use of it, so a compiled step evaluated the trig functions once per element
of q and k in each of the 30 layers: 19 us of a 6-row verify's layer on the AVX2 path, 0.56 ms a step
(analysis/profile_step_cpu_avx512_avx2_path/). A table of the model's own values, computed once by its own
embedding, turns that into a row gather. Rotary kinds whose frequencies follow the sequence length (dynamic,
longrope) are left as they are.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

LENGTH_DEPENDENT = ("dynamic", "longrope")  # rope types whose frequencies change with the length seen


class TableRotary(nn.Module):
    """`rotary`'s (cos, sin) for positions below `positions`, looked up: the same values, bit for bit."""

    def __init__(self, rotary: nn.Module, positions: int) -> None:
        super().__init__()
        ids = torch.arange(positions, device=rotary.inv_freq.device)[None]
        with torch.no_grad():
            cos, sin = rotary(torch.empty(0, dtype=torch.float32, device=ids.device), ids)
        # float32, before the cast to the activations' dtype that each call makes, as transformers' does
        self.register_buffer("cos", cos[0].contiguous(), persistent=False)  # [positions, head dim]
        self.register_buffer("sin", sin[0].contiguous(), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # position_ids [B, k] -> cos, sin [B, k, head dim] in x's dtype
        return self.cos[position_ids].to(x.dtype), self.sin[position_ids].to(x.dtype)


def tabulate_rotary(model: nn.Module, positions: int) -> int:
    """Replace, in place, each rotary embedding of `model` whose frequencies are fixed (and whose forward takes just
    x and position_ids) by a `TableRotary` of `positions` positions (a fast path's capacity: a token's position is its
    column), where the table gives the module's own (cos, sin) in the model's dtype at the first, a middle and the last
    position; a module that returns something else (one complex tensor, or float32 whatever x's dtype) is left as it
    is. Returns how many were replaced."""
    found = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(getattr(child, "inv_freq", None), torch.Tensor)
        and hasattr(child, "attention_scaling")
        and list(inspect.signature(child.forward).parameters) == ["x", "position_ids"]
        and not any(kind in str(getattr(child, "rope_type", "")) for kind in LENGTH_DEPENDENT)
    ]
    if not found:
        return 0
    # the activations' dtype: the model's (transformers'), else its first floating-point parameter's
    dtype = getattr(model, "dtype", None) or next(
        (t.dtype for t in model.parameters() if t.is_floating_point()), torch.float32
    )
    replaced = 0
    for parent, name, child in found:
        try:
            table = TableRotary(child, positions)
        except (TypeError, ValueError, RuntimeError):  # not a (cos, sin) pair of [1, positions, d] tensors
            continue
        if _same(child, table, dtype, positions):
            setattr(parent, name, table)
            replaced += 1
    return replaced


def _same(rotary: nn.Module, table: TableRotary, dtype: torch.dtype, positions: int) -> bool:
    ids = torch.tensor([[0, positions // 2, positions - 1]], device=table.cos.device)
    x = torch.empty(0, dtype=dtype, device=ids.device)
    with torch.no_grad():
        want, got = rotary(x, ids), table(x, ids)
    return (
        isinstance(want, tuple)
        and len(want) == 2
        and all(w.dtype == g.dtype and w.shape == g.shape and torch.equal(w, g) for w, g in zip(want, got))
    )

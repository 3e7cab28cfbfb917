"""specbench's bf16 weight kernels (`cpu_bf16.cpp`): a product of a few activation rows with a bf16 weight that
streams it once, split across all threads, and the read-bandwidth probes (`cpu_stream.cpp`: `stream_sum` over a
buffer of its own, `stream_read` over tensors where they lie: a model's weights).

Built into the extension of `cpu_matvec` (its `available()` builds and loads them); this module registers their
shapes for `torch.compile` and picks the ISA path. The AVX-512-BF16 path (vdpbf16ps) runs where the CPU has it and
torch's own kernel level is AVX-512; ATEN_CPU_CAPABILITY=avx2, or `isa=AVX2`, takes the AVX2 + FMA path.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from specbench.models import cpu_matvec

AUTO, AVX2, AVX512_BF16, AMX_BF16 = 0, 1, 2, 3  # the ops' `isa` argument (cpu_bf16.cpp's `Isa`)
ISA_NAMES = {AVX2: "avx2", AVX512_BF16: "avx512_bf16", AMX_BF16: "amx_bf16"}
MAX_ROWS = 8  # activation rows per pass over the weight (cpu_bf16.cpp); more rows read it again per 8


@functools.cache
def available() -> bool:
    """Whether the ops are loaded in this process (`cpu_matvec.available()` builds them on first use)."""
    if not cpu_matvec.available():
        return False
    torch.library.register_fake("specbench::bf16_matvec")(_matvec_shape)
    torch.library.register_fake("specbench::stream_sum")(lambda buffer, isa=AUTO: buffer.new_empty(()))
    torch.library.register_fake("specbench::stream_read")(
        lambda buffers, isa=AUTO: buffers[0].new_empty((), dtype=torch.int64)
    )
    return True


def _matvec_shape(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, isa: int = AUTO) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def _ops():
    if not available():
        raise RuntimeError(
            "cpu_bf16: specbench's kernels are not available in this process (see cpu_matvec.available(): "
            f"{cpu_matvec.SWITCH_ENV}, x86-64 with AVX2 and FMA, a C++ compiler); check cpu_bf16.available() first"
        )
    return torch.ops.specbench


def isa_path(isa: int = AUTO) -> str:
    """The path `isa` runs on this machine and process: 'avx2', 'avx512_bf16' or 'amx_bf16' (passes of two or more
    activation rows on AMX tiles, one row as avx512_bf16)."""
    return ISA_NAMES[_ops().bf16_isa(isa)]


def bf16_matvec(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, isa: int = AUTO):
    """x [M, K] (bf16 or fp32) @ weight [N, K] bf16 .T (+ bias) → [M, N] in x's dtype, fp32 sums. The
    AVX-512 path rounds fp32 activations to bf16 first (its products are bf16 x bf16); the AVX2 path keeps them."""
    return _ops().bf16_matvec(x, weight, bias, isa)


def stream_sum(buffer: torch.Tensor, isa: int = AUTO) -> torch.Tensor:
    """The sum of a contiguous float32 buffer, read once with wide loads across all threads: the read probe."""
    return _ops().stream_sum(buffer, isa)


def stream_read(tensors: Sequence[torch.Tensor], isa: int = AUTO) -> torch.Tensor:
    """Reads contiguous CPU tensors where they lie (any dtype: their bytes as 32-bit words, summed as integers mod
    2^32; a tensor's last nbytes % 4 bytes left out), one parallel region for all, the bytes split evenly across
    all threads: the read probe over a model's own weights, whose pages may read faster or slower than a fresh
    buffer's. Returns the int64 checksum."""
    if not tensors:
        raise ValueError("stream_read: no tensors to read")
    return _ops().stream_read(list(tensors), isa)

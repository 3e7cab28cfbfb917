"""The AVX2 bf16 kernel alone at R rows on the down (576 x 1536) and gate/up (3072 x 576) shapes, ~64 MB of distinct
weights a shape; us a call and the share of the 2-core FMA peak. Alternated between two builds (old: HEAD in a
worktree; new: with row_slices.patch), each with its own TORCH_EXTENSIONS_DIR:

    ATEN_CPU_CAPABILITY=avx2 PYTHONPATH=<checkout> TORCH_EXTENSIONS_DIR=<dir per side> python row_slices_shapes.py 1
"""

import statistics
import sys
import time

import torch

from specbench.models import cpu_bf16

torch.set_num_threads(2)
cpu_bf16.available() if hasattr(cpu_bf16, "available") else None
op = torch.ops.specbench.bf16_matvec
isa = int(sys.argv[1]) if len(sys.argv) > 1 else 1
shapes = [(576, 1536), (3072, 576)]
for R in (4, 6):
    for N, K in shapes:
        # enough distinct weights to exceed the caches (~64 MB), as in a step
        copies = max(1, int(64e6 // (N * K * 2)))
        ws = [torch.randn(N, K).to(torch.bfloat16) for _ in range(copies)]
        x = torch.randn(R, K).to(torch.bfloat16)
        for w in ws[:2]:
            op(x, w, None, isa)
        ts = []
        for _rep in range(5):
            t = time.perf_counter()
            for w in ws:
                op(x, w, None, isa)
            ts.append((time.perf_counter() - t) / copies)
        t = statistics.median(ts)
        fmas = R * N * K / 8  # 8-lane FMAs
        peak = fmas / (2 * 2 * 2.6e9)
        print(
            f"R={R} N={N:6d} K={K:5d}: {t * 1e6:8.1f} us  GB/s {N * K * 2 / t / 1e9:5.1f}  FMA-peak share {peak / t:.2f}"
        )

"""cache_attention alone at a step's shapes, warm: the embedded pair's 9 query heads over 3 key/value heads, d 64,
bf16, 300 of a 960-column cache, k = 1, 5, 7 query rows (a decode step; a gamma 4 and a gamma 6 verify) with a
verify's causal mask, 30 calls a round like a step's 30 layers, 2 threads; median of 5 blocks of 300 rounds.

    python analysis/attention_avx2_rows_cpu_avx512/attention_probe.py [isa ...]   # 1 avx2 (default), 2 avx512_bf16

Side by side with the form before (`git worktree add /tmp/old <commit>`), alternating processes:

    for i in 1 2 3 4; do python analysis/attention_avx2_rows_cpu_avx512/attention_probe.py | sed "s/^/new$i /"
      PYTHONPATH=/tmp/old TORCH_EXTENSIONS_DIR=/tmp/ext_old \\
        python analysis/attention_avx2_rows_cpu_avx512/attention_probe.py | sed "s/^/old$i /"; done
"""

import statistics
import sys
import time

import torch

from specbench.models import cpu_matvec

assert cpu_matvec.available(), "specbench's CPU kernels did not build here"
torch.manual_seed(0)
torch.set_num_threads(2)
C, CALLS, ROUNDS = 300, 30, 300
caches = [(torch.randn(1, 3, 960, 64).bfloat16(), torch.randn(1, 3, 960, 64).bfloat16()) for _ in range(CALLS)]
views = [(k[:, :, :C], v[:, :, :C]) for k, v in caches]
for k in (1, 5, 7):
    q = torch.randn(1, 9, k, 64).bfloat16()
    mask = torch.zeros(1, 1, k, C)
    for i in range(k):
        mask[0, 0, i, C - k + i + 1 :] = torch.finfo(torch.float32).min
    for isa in [int(a) for a in sys.argv[1:]] or [cpu_matvec.ATTENTION_AVX2]:
        for _ in range(20):
            for key, value in views:
                cpu_matvec.cache_attention(q, key, value, mask, 0.125, isa)
        blocks = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(ROUNDS):
                for key, value in views:
                    cpu_matvec.cache_attention(q, key, value, mask, 0.125, isa)
            blocks.append((time.perf_counter() - t0) / ROUNDS / CALLS * 1e6)
        us = statistics.median(blocks)
        print(
            f"k={k} form={cpu_matvec.ATTENTION_FORMS[isa]}: {us:.1f} us a call, {us * CALLS / 1000:.2f} ms a step "
            f"[{min(blocks):.1f}, {max(blocks):.1f}]"
        )

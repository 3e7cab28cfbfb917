"""specbench's bf16 weight kernel at one activation row against the read probe (`stream_sum`) over the same bytes,
per embedded-model shape, weights cold (a ring of copies larger than the last-level cache), and the cost of a tiny
call; torch's kernel level as the environment sets it (ATEN_CPU_CAPABILITY=avx2 for the AVX2 forms).

    python analysis/engines_w8a16_cpu_amx/kernel_vs_probe.py [threads]
"""

import statistics
import sys
import time

import torch

from specbench.models import cpu_bf16

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
RING_MB = 512


def ring_time(fn, ring, rounds=7):
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        for w in ring:
            fn(w)
        ts.append((time.perf_counter() - t) / len(ring) * 1e6)
    return statistics.median(ts)


x1 = torch.randn(1, 576).bfloat16()
tiny = torch.randn(16, 576).bfloat16()
print(
    "tiny call (16x576, warm):",
    round(ring_time(lambda w: cpu_bf16.bf16_matvec(x1, tiny, None, 0), [tiny] * 2000), 2),
    "us",
)
for n, k in ((576, 576), (960, 576), (3072, 576), (576, 1536), (49152, 576)):
    ring = [torch.randn(n, k).bfloat16() for _ in range(max(2, RING_MB * 2**20 // (2 * n * k)))]
    fring = [w.view(torch.float32).reshape(-1) for w in ring]
    x = torch.randn(1, k).bfloat16()
    a = ring_time(lambda w, x=x: cpu_bf16.bf16_matvec(x, w, None, 0), ring)
    b = ring_time(lambda w: cpu_bf16.stream_sum(w), fring)
    mb = 2 * n * k / 1e6
    print(
        f"{n}x{k} ({mb:.2f} MB): matvec {a:.1f} us ({mb / a * 1e3:.1f} GB/s), stream_sum {b:.1f} us "
        f"({mb / b * 1e3:.1f} GB/s)",
        flush=True,
    )

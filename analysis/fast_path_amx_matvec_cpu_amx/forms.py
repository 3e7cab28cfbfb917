"""specbench's bf16 weight kernel on its AVX-512 BF16 and AMX forms, per embedded-model shape and activation rows, the
weights cold (a ring of copies larger than the last-level cache, as a decode step meets them), alternated round by
round in one process.

    python analysis/fast_path_amx_matvec_cpu_amx/forms.py [--threads 2] [--rounds 7] [--ring-mb 512]
"""

import argparse
import statistics
import time

import torch

from specbench.bench.envinfo import hardware_label
from specbench.models import cpu_bf16

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--rounds", type=int, default=7)
ap.add_argument("--ring-mb", type=int, default=512)
args = ap.parse_args()
torch.set_num_threads(args.threads)
assert cpu_bf16.available()
forms = {"avx512_bf16": cpu_bf16.AVX512_BF16, "amx_bf16": cpu_bf16.AMX_BF16}
print(
    f"{hardware_label('cpu')}, {args.threads} threads, weights cold (ring of {args.ring_mb} MB), {args.rounds} rounds"
)
for n, k in ((576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)):
    ring = [torch.randn(n, k).bfloat16() for _ in range(max(2, args.ring_mb * 2**20 // (2 * n * k)))]
    for rows in (1, 2, 5, 8):
        x = torch.randn(rows, k).bfloat16()
        times = {name: [] for name in forms}
        for r in range(args.rounds):
            for name in forms if r % 2 == 0 else reversed(list(forms)):
                t = time.perf_counter()
                for w in ring:
                    cpu_bf16.bf16_matvec(x, w, None, forms[name])
                times[name].append((time.perf_counter() - t) / len(ring) * 1e6)
        gbs = {name: 2 * n * k / statistics.median(ts) / 1e3 for name, ts in times.items()}
        line = ", ".join(f"{name} {statistics.median(ts):.1f} us ({gbs[name]:.1f} GB/s)" for name, ts in times.items())
        print(f"{n}x{k}, {rows} rows: {line}", flush=True)

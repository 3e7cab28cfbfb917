"""Is the AVX2 bf16 verify step (k rows) bound by FMA throughput? specbench's bf16 kernel on the AVX2 path over
the embedded target's weight shapes (random bf16, 30 layers + head, ~269 MB), k = 1 and 5 rows, at 1 and 2 torch
threads, interleaved in one process, beside the read probe at the same thread counts.

    ATEN_CPU_CAPABILITY=avx2 python analysis/engines_w8a16_cpu_avx2_path/fma_probe.py [--rounds 9]

Prints median ms per setting and, for k rows, the FMA instructions per ns the kernel issued
(k x weights / 8 lanes / time): one core's two FMA ports at the VM's 2.6 GHz issue at most 5.2 per ns.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import specbench  # noqa: F401 - caps oneDNN at AVX2 under ATEN_CPU_CAPABILITY=avx2
from specbench.models import cpu_bf16

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(o, i, generator=g).to(torch.bfloat16) for o, i in SHAPES]
    n_weights = sum(w.numel() for w in weights)
    stream = torch.cat([w.reshape(-1) for w in weights]).view(torch.float32)  # the same bytes, read as float32
    xs = {k: [torch.randn(k, w.shape[1], generator=g).to(torch.bfloat16) for w in weights] for k in (1, 5)}
    runs = {}
    for threads in (1, 2):
        for k in (1, 5):
            runs[(threads, f"k={k}")] = lambda k=k: [
                cpu_bf16.bf16_matvec(x, w, None, cpu_bf16.AVX2) for x, w in zip(xs[k], weights)
            ]
        runs[(threads, "read")] = lambda: cpu_bf16.stream_sum(stream, cpu_bf16.AVX2)
    times = {key: [] for key in runs}
    with torch.inference_mode():
        for r in range(args.rounds + 1):
            for (threads, what), f in runs.items():
                torch.set_num_threads(threads)
                t0 = time.perf_counter()
                f()
                if r:  # the first round warms up
                    times[(threads, what)].append(time.perf_counter() - t0)
    print(f"weights {n_weights / 1e6:.1f} M ({2 * n_weights / 1e6:.0f} MB bf16), {args.rounds} rounds, median ms")
    for (threads, what), ts in times.items():
        ms = statistics.median(ts) * 1e3
        line = f"threads={threads} {what:5s} {ms:7.2f} ms  [{min(ts) * 1e3:.2f}, {max(ts) * 1e3:.2f}]"
        if what == "read":
            line += f"  {2 * n_weights / ms / 1e6:.1f} GB/s"
        else:
            k = int(what[2:])
            line += f"  {k * n_weights / 8 / (ms * 1e6):.2f} FMA/ns  {2 * n_weights / ms / 1e6:.1f} GB/s of weights"
        print(line)


if __name__ == "__main__":
    main()

"""specbench's bf16 weight kernel alone over the embedded target's weight shapes (random bf16, 30 layers + head,
~269 MB), at k activation rows and 1 and 2 torch threads, interleaved in one process beside the read probe at the
same thread counts: how far one step's weight stream is from the read floor, and what k rows add to it.

    python scripts/kernel_probe.py [--isa auto|avx2|avx512_bf16|amx_bf16] [--ks 1 5] [--rounds 9]
    ATEN_CPU_CAPABILITY=avx2 python scripts/kernel_probe.py --isa avx2

Prints median ms [min, max] per setting, the weights' GB/s, and for k rows the product instructions a ns the kernel
issued: FMAs of 8 lanes on the AVX2 path, vdpbf16ps of 32 bf16 pairs on AVX-512-BF16 (k x weights / lanes / time).
`bash scripts/ab_kernel.sh` alternates this probe between two checkouts.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import specbench  # noqa: F401 - caps oneDNN at AVX2 under ATEN_CPU_CAPABILITY=avx2
from specbench.models import cpu_bf16

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
ISAS = {"auto": cpu_bf16.AUTO, **{name: isa for isa, name in cpu_bf16.ISA_NAMES.items()}}
LANES = {"avx2": (8, "FMA"), "avx512_bf16": (32, "vdpbf16ps"), "amx_bf16": (32, "vdpbf16ps-equivalent")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--isa", choices=sorted(ISAS), default="auto")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    if any(k < 1 for k in args.ks) or args.rounds < 1:
        ap.error(f"--ks {args.ks} and --rounds {args.rounds}: each at least 1")
    if not cpu_bf16.available():
        ap.error("specbench's CPU kernels are not available here (see specbench.models.cpu_matvec.available())")
    isa = ISAS[args.isa]
    path = cpu_bf16.isa_path(isa)
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(o, i, generator=g).to(torch.bfloat16) for o, i in SHAPES]
    n_weights = sum(w.numel() for w in weights)
    stream = torch.cat([w.reshape(-1) for w in weights]).view(torch.float32)  # the same bytes, read as float32
    xs = {k: [torch.randn(k, w.shape[1], generator=g).to(torch.bfloat16) for w in weights] for k in args.ks}
    runs = {}
    for threads in (1, 2):
        for k in args.ks:
            runs[(threads, f"k={k}")] = lambda k=k: [
                cpu_bf16.bf16_matvec(x, w, None, isa) for x, w in zip(xs[k], weights)
            ]
        runs[(threads, "read")] = lambda: cpu_bf16.stream_sum(stream, isa)
    times = {key: [] for key in runs}
    with torch.inference_mode():
        for r in range(args.rounds + 1):
            for (threads, what), f in runs.items():
                torch.set_num_threads(threads)
                t0 = time.perf_counter()
                f()
                if r:  # the first round warms up
                    times[(threads, what)].append(time.perf_counter() - t0)
    megabytes = 2 * n_weights / 1e6
    print(f"path {path}; weights {n_weights / 1e6:.1f} M ({megabytes:.0f} MB bf16), {args.rounds} rounds, median ms")
    lanes, instr = LANES[path]
    for (threads, what), ts in times.items():
        ms = statistics.median(ts) * 1e3
        line = f"threads={threads} {what:5s} {ms:7.2f} ms  [{min(ts) * 1e3:.2f}, {max(ts) * 1e3:.2f}]"
        if what == "read":
            line += f"  {megabytes / ms:.1f} GB/s"
        else:
            k = int(what[2:])
            line += f"  {k * n_weights / lanes / (ms * 1e6):.2f} {instr}/ns  {megabytes / ms:.1f} GB/s of weights"
        print(line)


if __name__ == "__main__":
    main()

"""specbench's bf16 kernel at one row, per weight shape of the embedded target: GB/s of weights streamed, each shape's
copies adding up to ~96 MB (past the last-level cache), median of 7 passes, 2 threads.

    python analysis/avx2_verify_cpu_avx512/stream_per_shape.py [avx512_bf16|avx2] [read GB/s for the floor column]
"""

import statistics
import sys
import time

import torch

from specbench.models import cpu_bf16

SHAPES = [(960, 576), (576, 576), (192, 576), (3072, 576), (1536, 576), (576, 1536), (49152, 576)]


def main() -> None:
    torch.set_num_threads(2)
    isa = {name: isa for isa, name in cpu_bf16.ISA_NAMES.items()}[sys.argv[1] if len(sys.argv) > 1 else "avx512_bf16"]
    read = float(sys.argv[2]) * 1e9 if len(sys.argv) > 2 else 35.6e9
    for shape in SHAPES:
        nbytes = shape[0] * shape[1] * 2
        weights = [torch.randn(*shape, dtype=torch.bfloat16) for _ in range(max(2, int(96e6 // nbytes)))]
        x = torch.randn(1, shape[1], dtype=torch.bfloat16)
        passes = []
        for _ in range(7):
            start = time.perf_counter()
            for w in weights:
                cpu_bf16.bf16_matvec(x, w, None, isa)
            passes.append((time.perf_counter() - start) / len(weights))
        t = statistics.median(passes)
        print(f"{shape}: {t * 1e6:.1f} us a call, {nbytes / t / 1e9:.1f} GB/s; at the read rate {nbytes / read * 1e6:.1f} us")


if __name__ == "__main__":
    main()

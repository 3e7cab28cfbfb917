"""A prefill's bf16 linears on CPU three ways, per decoder layer of the embedded SmolLM2 (q/k/v, o, gate/up, down
as fused shapes), interleaved, median of 7 timed calls after a warm-up:

- torch's bf16 `F.linear` (what `CpuLinear` runs past its own and gemv rows where oneDNN cannot prepack bf16);
- the same weights widened to float32 for the call, the product in float32, rounded back to bf16 ("upcast");
- float32 weights (what a float32 target runs).

    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python analysis/prefill_upcast_cpu_amx_avx2_only/probe.py
"""

import statistics
import sys
import time

import torch
from torch import nn

from specbench.bench.envinfo import hardware_label

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # [out, in]
g = torch.Generator().manual_seed(0)
print(f"{hardware_label('cpu')}, {torch.get_num_threads()} threads; ms per layer (4 linears), median of 7")
print("rows | bf16 F.linear | upcast to fp32 | fp32 weights | bf16 / upcast")
for rows in (16, 64, 300):
    total = {"bf16": 0.0, "upcast": 0.0, "fp32": 0.0}
    for out_f, in_f in SHAPES:
        w32 = torch.randn(out_f, in_f, generator=g)
        wb, x = w32.bfloat16(), torch.randn(rows, in_f, generator=g).bfloat16()
        runs = {
            "bf16": lambda: nn.functional.linear(x, wb),
            "upcast": lambda: nn.functional.linear(x.float(), wb.float()).bfloat16(),
            "fp32": lambda: nn.functional.linear(x.float(), w32),
        }
        times = {k: [] for k in runs}
        with torch.inference_mode():
            for i in range(8):
                for k, f in runs.items():
                    start = time.perf_counter()
                    f()
                    if i:
                        times[k].append(time.perf_counter() - start)
        for k, t in times.items():
            total[k] += statistics.median(t)
    ms = {k: v * 1e3 for k, v in total.items()}
    print(f"{rows} | {ms['bf16']:.2f} | {ms['upcast']:.2f} | {ms['fp32']:.2f} | {ms['bf16'] / ms['upcast']:.2f}x")

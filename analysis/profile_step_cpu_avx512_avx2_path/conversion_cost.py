"""What torch's bf16 -> float32 conversion of a matvec's activations costs a call, unprofiled, from Python (the
AVX2 matvec made it 121 times a step before it widened the rows itself):

    ATEN_CPU_CAPABILITY=avx2 python analysis/profile_step_cpu_avx512_avx2_path/conversion_cost.py
"""

import statistics
import time

import torch

torch.set_num_threads(2)
for shape in [(1, 576), (1, 1536), (6, 576), (6, 1536)]:
    x = torch.randn(*shape).bfloat16()
    for _ in range(1000):
        x.to(torch.float32)
    per_call = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(2000):
            x.to(torch.float32)
        per_call.append((time.perf_counter() - start) / 2000 * 1e6)
    print(f"{shape}: median {statistics.median(per_call):.2f} us a call [{min(per_call):.2f}, {max(per_call):.2f}]")

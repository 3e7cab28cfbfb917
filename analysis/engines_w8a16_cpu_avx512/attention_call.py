"""One decode step's attention call alone, warm, at the embedded pair's shapes (9 query heads over 3 key/value heads,
d 64, bf16, 300 of a 960-column cache, k = 1), 30 calls a round like a step's 30 layers; then where its time goes.

    python analysis/engines_w8a16_cpu_avx512/attention_call.py [threads]
    perf record -o perf.data python analysis/engines_w8a16_cpu_avx512/attention_call.py 1
    perf report -i perf.data --no-children --sort symbol
"""

import sys
import time

import torch

from specbench.models import cpu_matvec

torch.manual_seed(0)
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
C, CALLS, ROUNDS = 300, 30, 3000
caches = [(torch.randn(1, 3, 960, 64).bfloat16(), torch.randn(1, 3, 960, 64).bfloat16()) for _ in range(CALLS)]
q = torch.randn(1, 9, 1, 64).bfloat16()
views = [(k[:, :, :C], v[:, :, :C]) for k, v in caches]
for _ in range(50):
    for k, v in views:
        cpu_matvec.cache_attention(q, k, v, None, 0.125)
t0 = time.perf_counter()
for _ in range(ROUNDS):
    for k, v in views:
        cpu_matvec.cache_attention(q, k, v, None, 0.125)
print(
    f"threads={torch.get_num_threads()} form={cpu_matvec.attention_form()}: "
    f"{(time.perf_counter() - t0) / ROUNDS / CALLS * 1e6:.2f} us a call"
)

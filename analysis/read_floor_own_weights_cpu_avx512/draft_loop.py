"""The compiled W8A16 draft's decode loop alone, for perf: a 300-token prompt, then k = 1 steps back to back
(N of them, the context growing from 300 to 300 + N columns, so attention weighs more than in a 128-token request).

    python analysis/read_floor_own_weights_cpu_avx512/draft_loop.py 4000 > loop.out &
    # once loop.out says LOOP START:
    perf record -F 1999 -p <its pid> -o loop.perf -- sleep 12
    perf script -i loop.perf -F tid,ip,dso | awk '{print $1, $NF}' | sort | uniq -c   # samples per thread and library
"""

import sys
import time

import torch

from specbench.config import DraftConfig, PairConfig
from specbench.decoding.forward import ForwardPath
from specbench.models.pair import load_pair

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
torch.set_num_threads(2)
pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="w8a16"))
fast = ForwardPath("compiled", "max-autotune", 300 + steps + 2)
fast.warm_up(pair.draft_model, 1, [1])
lm = fast.lm(pair.draft_model)
x = torch.zeros(1, 1, dtype=torch.long)
lm.prefill([list(range(100, 400))])
with torch.inference_mode():
    lm.feed(x)
    time.sleep(0.5)
    print("LOOP START", flush=True)
    start = time.perf_counter()
    for _ in range(steps):
        lm.feed(x)
    print(f"{(time.perf_counter() - start) / steps * 1e3:.2f} ms a step")

"""In one process: StaticLMs compiled with inductor's CPU realize threshold at specbench's 10 and at inductor's 50, alternated.

ATEN_CPU_CAPABILITY=avx2 python ab_realize_threshold.py target 6
"""

import statistics
import sys
import time

import torch
import torch._inductor.config as inductor

from specbench.config import DraftConfig, PairConfig
from specbench.decoding import compile_cache
from specbench.decoding.static_kv import StaticLM
from specbench.models.pair import load_pair

torch.set_num_threads(2)
which, k = sys.argv[1], int(sys.argv[2])
pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="w8a16"))
model = pair.draft_model if which == "draft" else pair.target
lms = {}
orig = compile_cache.compiled_forward
for name, limit in (("t10", 10), ("t50", 50)):

    def patched(*a, limit=limit, **kw):
        f = orig(*a, **kw)
        inductor.realize_cpu_opcount_threshold = limit  # after compiled_forward's own min(…, 10)
        return f

    compile_cache.compiled_forward = patched
    import specbench.decoding.static_kv as sk

    sk.compiled_forward = patched
    lm = StaticLM(model, 640, compile_mode="max-autotune")
    print(name, "compile", round(lm.warm_up(1, [k]), 1), flush=True)  # compiles now, under this limit
    lms[name] = lm
x = torch.zeros(1, k, dtype=torch.long)


def blk(lm, n=24):
    lm.prefill([list(range(100, 400))])
    with torch.inference_mode():
        lm.feed(x)
        t = time.perf_counter()
        for _ in range(n):
            lm.feed(x)
    return (time.perf_counter() - t) / n


ts = {n: [] for n in lms}
for r in range(14):
    for name in ("t10", "t50") if r % 2 else ("t50", "t10"):
        ts[name].append(blk(lms[name]))
ratios = sorted(b / a for a, b in zip(ts["t10"], ts["t50"]))
print(
    f"{which} k={k}: t10 {1e3 * statistics.median(ts['t10']):.3f} ms, t50 {1e3 * statistics.median(ts['t50']):.3f} ms; t50/t10 median {statistics.median(ratios):.3f} range {ratios[0]:.3f}-{ratios[-1]:.3f} n={len(ratios)}"
)
a, b = lms["t10"], lms["t50"]
a.prefill([list(range(100, 400))])
b.prefill([list(range(100, 400))])
with torch.inference_mode():
    la = a.feed(torch.tensor([[7] * k]))
    lb = b.feed(torch.tensor([[7] * k]))
print("same logits:", torch.equal(la, lb))

"""In one process: the compiled step (forward, under StaticLM's stance) with dynamo's guards as default vs with
`use_recursive_dict_tags_for_guards` (an nn.Module subtree whose dict tags match skips its guards), alternated.

    python ab_dict_tags.py target 1
"""

import statistics
import sys
import time

import torch
import torch._dynamo.config as dyn

from specbench.config import DraftConfig, PairConfig
from specbench.decoding.static_kv import StaticLM
from specbench.models.pair import load_pair

torch.set_num_threads(2)
which, k = sys.argv[1], int(sys.argv[2])
pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="w8a16"))
model = pair.draft_model if which == "draft" else pair.target
lms = {}
for name, flag in (("default", False), ("dict_tags", True)):
    dyn.use_recursive_dict_tags_for_guards = flag
    lm = StaticLM(model, 640, compile_mode="max-autotune")
    print(name, "compile", round(lm.warm_up(1, [k]), 1), flush=True)
    lms[name] = lm
x = torch.zeros(1, k, dtype=torch.long)


def fwd(lm, n=24):
    lm.prefill([list(range(100, 400))])
    with torch.inference_mode():
        positions = torch.tensor([[300 + i for i in range(k)]])
        columns = lm._columns_to(300 + k)
        xi = x.clone()
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            lm._forward(xi, positions, columns)
            t = time.perf_counter()
            for _ in range(n):
                lm._forward(xi, positions, columns)
    return (time.perf_counter() - t) / n


def feed(lm, n=24):
    lm.prefill([list(range(100, 400))])
    with torch.inference_mode():
        lm.feed(x)
        t = time.perf_counter()
        for _ in range(n):
            lm.feed(x)
    return (time.perf_counter() - t) / n


for what, f in (("forward", fwd), ("feed", feed)):
    ts = {n: [] for n in lms}
    for r in range(12):
        for name in ("default", "dict_tags") if r % 2 else ("dict_tags", "default"):
            ts[name].append(f(lms[name]))
    d = sorted(b - a for a, b in zip(ts["default"], ts["dict_tags"]))
    print(
        f"{which} k={k} {what}: default {1e3 * statistics.median(ts['default']):.3f} ms, dict_tags {1e3 * statistics.median(ts['dict_tags']):.3f} ms; "
        f"dict_tags - default per block pair: median {1e3 * statistics.median(d):+.3f} ms [{1e3 * d[0]:+.3f}, {1e3 * d[-1]:+.3f}] n={len(d)}"
    )
a, b = lms["default"], lms["dict_tags"]
a.prefill([list(range(100, 400))])
b.prefill([list(range(100, 400))])
with torch.inference_mode():
    print(
        "same logits:",
        torch.equal(a.feed(torch.tensor([[7] * k])), b.feed(torch.tensor([[7] * k]))),
        "new shapes:",
        a.new_shapes,
        b.new_shapes,
    )

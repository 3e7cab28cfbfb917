"""Side by side in one process: the compiled target (or draft) forward at k tokens with specbench's attention kernel
at every width up to `MAX_QUERY_ROWS` (new) and with it at one query only (old: the predicate limited to k = 1, so a
verify attends with bmm + softmax, as before), alternated block by block.

    python analysis/fast_path_verify_attention_cpu_amx/ab_interleaved.py [--model target|draft] [--draft w8a16] [--k 5] [--rounds 12] [--steps 16] [--prompt-tokens 300]
"""

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import specbench.decoding.attention as att
from specbench.bench.envinfo import hardware_label
from specbench.config import DraftConfig, PairConfig
from specbench.decoding.forward import ForwardPath
from specbench.models.pair import load_pair

ap = argparse.ArgumentParser()
ap.add_argument("--model", choices=("draft", "target"), default="target")
ap.add_argument("--draft", default="w8a16")
ap.add_argument("--dtype", default="bfloat16")
ap.add_argument("--compile-mode", default="max-autotune")
ap.add_argument("--k", type=int, default=5)
ap.add_argument("--rounds", type=int, default=12)
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--prompt-tokens", type=int, default=300)
args = ap.parse_args()
torch.set_num_threads(2)
pair = load_pair(PairConfig(dtype=args.dtype), DraftConfig(kind=args.draft))
model = pair.draft_model if args.model == "draft" else pair.target
need = args.prompt_tokens + (args.steps + 1) * args.k + 2
new_pred = att.cache_kernel
lms = {}
for name, cap in (("old", need), ("new", need + 1)):  # capacities differ: each LM compiles its own graphs
    att.cache_kernel = (
        (lambda q, k, v, m, d: q.shape[2] == 1 and new_pred(q, k, v, m, d)) if name == "old" else new_pred
    )
    fast = ForwardPath("compiled", args.compile_mode, cap)
    print(name, "compile s", round(fast.warm_up(model, 1, [args.k]), 1), flush=True)
    lms[name] = fast.lm(model)
att.cache_kernel = new_pred
x = torch.zeros(1, args.k, dtype=torch.long)
prompt = [list(range(100, 100 + args.prompt_tokens))]


def block(lm):
    lm.prefill(prompt)
    with torch.inference_mode():
        lm.feed(x)
        t = time.perf_counter()
        for _ in range(args.steps):
            lm.feed(x)
    return (time.perf_counter() - t) / args.steps


for name, lm in lms.items():  # each graph attends as its name says
    lm.prefill(prompt)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        lm.feed(x)
    assert any("cache_attention" in e.name for e in prof.events()) == (name == "new" or args.k == 1), name

times = {"old": [], "new": []}
for r in range(args.rounds):
    for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
        times[name].append(block(lms[name]))
ratios = sorted(n / o for n, o in zip(times["new"], times["old"]))
label = args.draft if args.model == "draft" else args.dtype
print(
    f"{hardware_label('cpu')}, 2 threads, {args.model} ({label}, {args.compile_mode}), k = {args.k}, "
    f"{args.prompt_tokens}-token prompt, {args.rounds} rounds x {args.steps} steps, alternated"
)
for name in ("old", "new"):
    ts = sorted(times[name])
    print(f"{name}: median {statistics.median(ts) * 1e3:.2f} ms (range {ts[0] * 1e3:.2f}-{ts[-1] * 1e3:.2f})")
print(
    f"new / old per round: median {statistics.median(ratios):.3f} (range {ratios[0]:.3f}-{ratios[-1]:.3f}; "
    f"quartiles {ratios[len(ratios) // 4]:.3f}-{ratios[(3 * len(ratios)) // 4]:.3f})"
)

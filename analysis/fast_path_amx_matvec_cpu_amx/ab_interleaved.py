"""Side by side in one process: the compiled bf16 target forward at k tokens with specbench's bf16 weight kernel on
its AMX form (new: `isa` auto, passes of 2+ rows on tiles) and on its AVX-512 BF16 form (old: `CpuLinear.isa` set
to avx512_bf16 while that graph is traced), alternated block by block.

    python analysis/fast_path_amx_matvec_cpu_amx/ab_interleaved.py [--k 5] [--rounds 20] [--steps 32] [--prompt-tokens 300]
"""

import argparse
import statistics
import time

import torch
from torch._dynamo.utils import counters

from specbench.bench.envinfo import hardware_label
from specbench.config import DraftConfig, PairConfig
from specbench.decoding.forward import ForwardPath
from specbench.models import cpu_bf16
from specbench.models.kernels import CpuLinear
from specbench.models.pair import load_pair

ap = argparse.ArgumentParser()
ap.add_argument("--compile-mode", default="max-autotune")
ap.add_argument("--k", type=int, default=5)
ap.add_argument("--rounds", type=int, default=20)
ap.add_argument("--steps", type=int, default=32)
ap.add_argument("--prompt-tokens", type=int, default=300)
args = ap.parse_args()
torch.set_num_threads(2)
assert cpu_bf16.isa_path() == "amx_bf16", cpu_bf16.isa_path()
pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="w8a16"))
model = pair.target
own = {f"{m.out_features}x{m.in_features}": m.own_counts for m in model.modules() if isinstance(m, CpuLinear)}
need = args.prompt_tokens + (args.steps + 1) * args.k + 2
lms = {}
for name, cap in (("old", need), ("new", need + 1)):  # capacities differ: each LM compiles its own graphs
    CpuLinear.isa = cpu_bf16.AVX512_BF16 if name == "old" else cpu_bf16.AUTO
    fast = ForwardPath("compiled", args.compile_mode, cap)
    print(name, "compile s", round(fast.warm_up(model, 1, [args.k]), 1), flush=True)
    lms[name] = fast.lm(model)
CpuLinear.isa = cpu_bf16.AUTO
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


compiled_frames = counters["frames"]["ok"]  # a recompile while timing (a guard on `CpuLinear.isa`) would show here
times = {"old": [], "new": []}
for r in range(args.rounds):
    for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
        times[name].append(block(lms[name]))
assert counters["frames"]["ok"] == compiled_frames, "a graph recompiled while timed: old and new may be the same"
ratios = sorted(n / o for n, o in zip(times["new"], times["old"]))
print(
    f"{hardware_label('cpu')}, 2 threads, target (bfloat16, {args.compile_mode}), k = {args.k}, "
    f"{args.prompt_tokens}-token prompt, {args.rounds} rounds x {args.steps} steps, alternated; own_counts {own}"
)
for name in ("old", "new"):
    ts = sorted(times[name])
    print(f"{name}: median {statistics.median(ts) * 1e3:.2f} ms (range {ts[0] * 1e3:.2f}-{ts[-1] * 1e3:.2f})")
print(
    f"new / old per round: median {statistics.median(ratios):.3f} (range {ratios[0]:.3f}-{ratios[-1]:.3f}; "
    f"quartiles {ratios[len(ratios) // 4]:.3f}-{ratios[(3 * len(ratios)) // 4]:.3f})"
)

"""Side by side in one process: compiled forwards run from inductor's C++ wrapper (new: `compile_cache.CPP_WRAPPER`)
and from its Python wrapper (old: the switch off while that graph compiles), alternated block by block, for the
bf16 target at k = 1 and k = 5 and the W8A16 draft at k = 1.

    python analysis/fast_path_cpp_wrapper_cpu_amx/ab_interleaved.py [--rounds 16] [--steps 32] [--prompt-tokens 300]
"""

import argparse
import statistics
import time

import torch
from torch._dynamo.utils import counters

from specbench.bench.envinfo import hardware_label
from specbench.config import DraftConfig, PairConfig
from specbench.decoding import compile_cache
from specbench.decoding.forward import ForwardPath
from specbench.models.pair import load_pair

ap = argparse.ArgumentParser()
ap.add_argument("--compile-mode", default="max-autotune")
ap.add_argument("--rounds", type=int, default=16)
ap.add_argument("--steps", type=int, default=32)
ap.add_argument("--prompt-tokens", type=int, default=300)
args = ap.parse_args()
torch.set_num_threads(2)
pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="w8a16"))
cases = {"target k=1": (pair.target, 1), "target k=5": (pair.target, 5), "draft k=1": (pair.draft_model, 1)}
prompt = [list(range(100, 100 + args.prompt_tokens))]
lms = {}
for case, (model, k) in cases.items():
    need = args.prompt_tokens + (args.steps + 1) * k + 2
    for name, cap in (("old", need), ("new", need + 1)):  # capacities differ: each LM compiles its own graphs
        compile_cache.CPP_WRAPPER = name == "new"
        fast = ForwardPath("compiled", args.compile_mode, cap)
        print(case, name, "compile s", round(fast.warm_up(model, 1, [k]), 1), flush=True)
        lms[case, name] = fast.lm(model)
compile_cache.CPP_WRAPPER = True


def block(lm, k):
    x = torch.zeros(1, k, dtype=torch.long)
    lm.prefill(prompt)
    with torch.inference_mode():
        lm.feed(x)
        t = time.perf_counter()
        for _ in range(args.steps):
            lm.feed(x)
    return (time.perf_counter() - t) / args.steps


compiled_frames = counters["frames"]["ok"]  # a recompile while timing would show here
print(
    f"{hardware_label('cpu')}, 2 threads, bf16 target / W8A16 draft ({args.compile_mode}), {args.prompt_tokens}-token"
    f" prompt, {args.rounds} rounds x {args.steps} steps, alternated"
)
for case, (_, k) in cases.items():
    times = {"old": [], "new": []}
    for r in range(args.rounds):
        for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
            times[name].append(block(lms[case, name], k))
    ratios = sorted(n / o for n, o in zip(times["new"], times["old"]))
    line = ", ".join(f"{n} median {statistics.median(ts) * 1e3:.2f} ms" for n, ts in times.items())
    print(
        f"{case}: {line}; new / old per round: median {statistics.median(ratios):.3f} "
        f"(range {ratios[0]:.3f}-{ratios[-1]:.3f}; quartiles {ratios[len(ratios) // 4]:.3f}-"
        f"{ratios[(3 * len(ratios)) // 4]:.3f}; n = {len(ratios)})",
        flush=True,
    )
assert counters["frames"]["ok"] == compiled_frames, "a graph recompiled while timed"

"""Where a compiled fast-path step's time goes outside its kernels, unprofiled: the decoder's `feed`, the dynamo-compiled
forward called directly (under the stance `StaticLM` uses), and inductor's compiled graph alone (its Python entry and
C++ wrapper, no dynamo, no AOT wrappers), alternated in blocks in one process; then cProfile of the forward.

    [ATEN_CPU_CAPABILITY=avx2] python analysis/break_even_cpu_avx512_avx2_path/call_split.py [--model draft|target] [--k 1]
"""

import argparse
import cProfile
import pstats
import statistics
import time

import torch
from torch._inductor import output_code

from specbench.bench.envinfo import hardware_label
from specbench.config import DraftConfig, PairConfig
from specbench.decoding.forward import ForwardPath
from specbench.models.pair import load_pair

ap = argparse.ArgumentParser()
ap.add_argument("--model", choices=("draft", "target"), default="draft")
ap.add_argument("--k", type=int, default=1)
a = ap.parse_args()
torch.set_num_threads(2)
pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="w8a16"))
model = pair.draft_model if a.model == "draft" else pair.target
fast = ForwardPath("compiled", "max-autotune", 640)
print(f"{hardware_label('cpu')}, 2 threads, {a.model} (w8a16 draft / bf16 target), k = {a.k}")
print(f"compile seconds: {fast.warm_up(model, 1, [a.k]):.1f}")
lm = fast.lm(model)
x = torch.zeros(1, a.k, dtype=torch.long)
captured = []
original = output_code.CompiledFxGraph.__call__


def spy(self, inputs):
    if not captured:
        captured.append((self, list(inputs)))
    return original(self, inputs)


output_code.CompiledFxGraph.__call__ = spy
lm.prefill([list(range(100, 400))])
with torch.inference_mode():
    lm.feed(x)
output_code.CompiledFxGraph.__call__ = original
graph, inputs = captured[0]
print(f"graph inputs: {len(inputs)} (constants passed on top by the C++ wrapper's Python entry)")
lm.prefill([list(range(100, 400))])
with torch.inference_mode():
    positions = torch.tensor([[300 + i for i in range(a.k)]])
    columns = lm._columns_to(300 + a.k)
    tokens = x.clone()


def feed_block(n=16):
    lm.prefill([list(range(100, 400))])
    with torch.inference_mode():
        lm.feed(x)
        t = time.perf_counter()
        for _ in range(n):
            lm.feed(x)
    return (time.perf_counter() - t) / n


def forward_block(n=16):
    with torch.inference_mode(), torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        t = time.perf_counter()
        for _ in range(n):
            lm._forward(tokens, positions, columns)
    return (time.perf_counter() - t) / n


def graph_block(n=16):
    with torch.inference_mode():
        t = time.perf_counter()
        for _ in range(n):
            graph(list(inputs))
    return (time.perf_counter() - t) / n


times = {"feed": [], "forward": [], "graph": []}
for _r in range(10):
    for name, block in (("feed", feed_block), ("forward", forward_block), ("graph", graph_block)):
        times[name].append(block())
print("ms a call, median [min, max] of 10 blocks of 16:")
for name, ts in times.items():
    print(f"  {name:8s} {1e3 * statistics.median(ts):.3f} [{1e3 * min(ts):.3f}, {1e3 * max(ts):.3f}]")
pairs = {
    "feed - forward (feed's own Python)": [f - g for f, g in zip(times["feed"], times["forward"])],
    "forward - graph (dynamo, AOT wrappers)": [f - g for f, g in zip(times["forward"], times["graph"])],
}
for name, d in pairs.items():
    print(f"  {name}: median {1e3 * statistics.median(d):.3f} ms a call (blocks side by side)")
with torch.inference_mode(), torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(64):
        lm._forward(tokens, positions, columns)
    profiler.disable()
print("cProfile of 64 forwards (it adds its own cost a Python call):")
pstats.Stats(profiler).sort_stats("tottime").print_stats(8)

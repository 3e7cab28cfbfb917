"""What dynamo's per-call guard check costs a compiled decode step, side by side in one process.

    python scripts/bench_guards.py [--threads 1] [--mode max-autotune] [--blocks 8] [--steps 15]

The embedded target's compiled k = 1 forward (`StaticLM.feed`, as `forward=compiled` runs it), in
blocks that alternate `StaticLM.skip_guards` (True, the default: a met shape runs only the guards that
tell its graphs apart; False: dynamo's full check). Each block feeds `steps` tokens and rolls them
back, so both settings do identical work. Prints the median step per setting and
the per-block paired difference.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specbench.bench.envinfo import hardware_label
from specbench.config import DraftConfig, PairConfig
from specbench.decoding.static_kv import StaticLM
from specbench.models.pair import load_pair


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mode", default="max-autotune")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="ngram")).target
    lm = StaticLM(target, 256, compile_mode=args.mode)
    print(f"compile: {lm.warm_up(1, [1]):.0f} s", flush=True)
    stances = {"full guard check": False, "skip_guard_eval_unsafe": True}
    medians: dict[str, list[float]] = {name: [] for name in stances}
    with torch.inference_mode():
        lm.prefill([list(range(100))])
        token = torch.zeros(1, 1, dtype=torch.long)
        for block in range(args.blocks):
            names = list(stances) if block % 2 == 0 else list(stances)[::-1]
            for name in names:
                lm.skip_guards = stances[name]
                times = []
                for _ in range(args.steps):
                    start = time.perf_counter()
                    lm.feed(token)
                    times.append(time.perf_counter() - start)
                lm.uncache_last([args.steps])
                medians[name].append(statistics.median(times))
    print(f"hardware `{hardware_label('cpu')}`, {args.threads} thread(s), compile mode {args.mode}")
    for name, values in medians.items():
        print(f"{name}: median step {statistics.median(values) * 1e3:.2f} ms over {len(values)} blocks")
    diffs = [(a - b) * 1e3 for a, b in zip(*medians.values())]
    print(
        f"paired difference per block (full − skip): median {statistics.median(diffs):.2f} ms, "
        f"range [{min(diffs):.2f}, {max(diffs):.2f}]"
    )


if __name__ == "__main__":
    main()

"""Side by side, process by process: a compiled forward at k tokens (the bf16 target's, or its W8A16 draft's) on two
checkouts of specbench, or at two thread counts, alternated round by round, each side's kernels built in a folder of
their own.

    python analysis/fast_path_threads_cpu_amx/ab_processes.py [--old /path/to/old/checkout]
        [--threads 2] [--old-threads N] [--model target|draft] [--ks 1 5] [--rounds 4] [--steps 32] [--blocks 5]
        [--prompt-tokens 300]

"old" is `--old` (default: this checkout) at `--old-threads` torch threads (default: `--threads`), "new" this
checkout at `--threads`: `--old-threads 1` alone compares 2 threads against 1 (inductor's kernels are compiled per
thread count: its cache keys on it).

Runs under the caller's environment (ATEN_CPU_CAPABILITY=avx2 for the AVX2 path). Each round starts one process per
checkout (order swapped every round); a process compiles the forward at every k (inductor's cache warm after the
first), then times `--blocks` blocks of `--steps` forwards per k and reports the median block. Prints each round's
new/old ratio per k and their median and range.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def child(args) -> None:
    import time

    import torch

    from specbench.config import DraftConfig, PairConfig
    from specbench.decoding.forward import ForwardPath
    from specbench.models.pair import load_pair

    torch.set_num_threads(args.threads)
    pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="w8a16"))
    model = pair.target if args.model == "target" else pair.draft_model
    need = args.prompt_tokens + (args.steps + 1) * max(args.ks) + 2
    fast = ForwardPath("compiled", "max-autotune", need)
    fast.warm_up(model, 1, args.ks)
    lm = fast.lm(model)
    prompt = [list(range(100, 100 + args.prompt_tokens))]
    result = {}
    for k in args.ks:
        x = torch.zeros(1, k, dtype=torch.long)
        blocks = []
        for _ in range(args.blocks):
            lm.prefill(prompt)
            with torch.inference_mode():
                lm.feed(x)
                t = time.perf_counter()
                for _ in range(args.steps):
                    lm.feed(x)
            blocks.append((time.perf_counter() - t) / args.steps)
        result[k] = statistics.median(blocks)
    print("RESULT " + json.dumps(result), flush=True)


def run(tree: Path, name: str, threads: int, args) -> dict[int, float]:
    env = dict(os.environ, PYTHONPATH=str(tree), TORCH_EXTENSIONS_DIR=f"/tmp/specbench_ab_ext_{name}")
    cmd = [sys.executable, __file__, "--child", "--model", args.model, "--threads", str(threads)]
    cmd += ["--ks", *map(str, args.ks), "--steps", str(args.steps)]
    cmd += ["--blocks", str(args.blocks), "--prompt-tokens", str(args.prompt_tokens)]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    return {int(k): v for k, v in json.loads(line[7:]).items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", type=Path, help="the checkout to compare against (default: this one)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the new side")
    ap.add_argument("--old-threads", type=int, default=None, help="torch threads of the old side (default: --threads)")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--model", choices=("target", "draft"), default="target", help="the bf16 target or its W8A16 draft")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args)
    new_tree = Path(__file__).resolve().parents[2]
    old_tree = args.old or new_tree
    sides = {"old": (old_tree, args.old_threads or args.threads), "new": (new_tree, args.threads)}
    from specbench.bench.envinfo import hardware_label

    print(f"{hardware_label('cpu')}, compiled {args.model} (bf16 target / W8A16 draft, max-autotune), {args.prompt_tokens}-token prompt")
    print(
        f"old: {old_tree} at {sides['old'][1]} threads; new: {new_tree} at {sides['new'][1]} threads; "
        f"{args.rounds} rounds x {args.blocks} blocks x {args.steps} steps"
    )
    times = {"old": [], "new": []}
    for r in range(args.rounds):
        for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
            times[name].append(run(sides[name][0], name, sides[name][1], args))
            print(f"round {r} {name}: " + ", ".join(f"k={k} {t * 1e3:.2f} ms" for k, t in times[name][-1].items()))
    for k in args.ks:
        ratios = sorted(n[k] / o[k] for n, o in zip(times["new"], times["old"]))
        old = statistics.median(t[k] for t in times["old"]) * 1e3
        new = statistics.median(t[k] for t in times["new"]) * 1e3
        print(
            f"k = {k}: old {old:.2f} ms, new {new:.2f} ms; new / old per round: median {statistics.median(ratios):.3f} "
            f"(range {ratios[0]:.3f}-{ratios[-1]:.3f}, n = {len(ratios)})"
        )


if __name__ == "__main__":
    main()

"""(Needs tried/c_shims.diff applied: `git apply analysis/avx2_verify_cpu_avx512/tried/c_shims.diff`; the change was reverted.)

Side by side in one process: a compiled step whose C++ wrapper calls specbench's ops through their C shims
(`cpu_matvec.C_SHIMS`) against one that calls them through the dispatcher, as before.

    python analysis/avx2_verify_cpu_avx512/tried/shims_ab.py [--model draft|target] [--draft w8a16] [--k 1] [--rounds 15]

Two StaticLMs of one model, each compiled under its own setting, timed in alternating blocks of 16 steps (which
goes first alternates too); prints each round's shim/dispatcher ratio and their median and range.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specbench.bench.envinfo import hardware_label
from specbench.config import DraftConfig, PairConfig
from specbench.decoding.static_kv import StaticLM
from specbench.models import cpu_matvec
from specbench.models.pair import load_pair

PROMPT = list(range(100, 400))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("draft", "target"), default="draft")
    ap.add_argument("--draft", default="w8a16")
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind=args.draft))
    model = pair.draft_model if args.model == "draft" else pair.target
    capacity = len(PROMPT) + args.k * (args.block + 2) + 1
    shims = dict(cpu_matvec.C_SHIMS)
    lms = {}
    for side in ("dispatcher", "shims"):  # the inductor setting is read when each one compiles (warm-up)
        cpu_matvec.C_SHIMS = shims if side == "shims" else {}
        lms[side] = StaticLM(model, capacity, compile_mode="max-autotune")
        print(f"{side}: compile {lms[side].warm_up(1, [args.k]):.1f} s", flush=True)
    x = torch.zeros(1, args.k, dtype=torch.long)

    def block(lm: StaticLM) -> float:
        lm.prefill([PROMPT])
        with torch.inference_mode():
            lm.feed(x)
            start = time.perf_counter()
            for _ in range(args.block):
                lm.feed(x)
        return (time.perf_counter() - start) / args.block

    times = {side: [] for side in lms}
    for r in range(args.rounds):
        for side in (("dispatcher", "shims") if r % 2 == 0 else ("shims", "dispatcher")):
            times[side].append(block(lms[side]))
    ratios = [s / d for s, d in zip(times["shims"], times["dispatcher"])]
    print(f"{hardware_label('cpu')}, {args.threads} thread(s), {args.model} ({args.draft if args.model == 'draft' else 'bf16'}), "
          f"k = {args.k}, {args.rounds} rounds of {args.block} steps")
    for side, t in times.items():
        print(f"  {side}: median {statistics.median(t) * 1e3:.2f} ms (range {min(t) * 1e3:.2f}-{max(t) * 1e3:.2f})")
    print(f"  shims / dispatcher per round: median {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()

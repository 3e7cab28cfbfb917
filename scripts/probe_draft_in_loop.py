"""Does a compiled draft step cost more inside the speculative loop than alone? One process, interleaved.

    python scripts/probe_draft_in_loop.py [--draft w4a16h8] [--gamma 5] [--capacity 384] [--prompt-tokens 100]
                                          [--rounds 30] [--threads 2] [--dtype float32] [--compile-mode default]

Compiles the embedded target (k = 1 and γ + 1) and the draft (k = 1 and 2) on the fast path, prefills one
prompt into both, then repeats three kinds of draft round (a k = 2 catch-up and γ - 1 steps of k = 1, rolled
back after): alone, right after a target verify of γ + 1 tokens, and right after reading a buffer larger than
both models (to evict their weights from the caches). Medians with p10 / p90 per kind; the first rounds are
dropped. Same process, same hour: a difference between the kinds is the loop's, not the host's drift.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specbench.bench.envinfo import hardware_label
from specbench.config import DraftConfig, PairConfig
from specbench.decoding.forward import DRAFT_KS, ForwardPath, target_ks
from specbench.models.pair import load_pair

KINDS = ("alone", "after a verify", "after a 1 GB read")
SKIP = 3  # first rounds dropped (allocator and caches settling)


def ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", default="w4a16h8", help="draft.kind (a kind with a model)")
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--capacity", type=int, default=384, help="KV columns per row (the bench's, for its prompts)")
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", help="pair.dtype (float32 puts W8A16/W4A16 on specbench's kernels)")
    ap.add_argument("--compile-mode", default="max-autotune", help="inductor mode (the bench's AVX2 runs use default)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(PairConfig(dtype=args.dtype), DraftConfig(kind=args.draft))
    if pair.draft_model is None:
        raise SystemExit(f"--draft {args.draft!r} has no model to time")
    fast = ForwardPath("compiled", args.compile_mode, args.capacity)
    compile_s = (fast.warm_up(pair.target, 1, target_ks(args.gamma)), fast.warm_up(pair.draft_model, 1, DRAFT_KS))
    print(f"compile seconds: target {compile_s[0]:.0f}, draft {compile_s[1]:.0f}", flush=True)
    target, draft = fast.lm(pair.target), fast.lm(pair.draft_model)
    prompt = list(range(100, 100 + args.prompt_tokens))
    target.prefill([prompt])
    draft.prefill([prompt])
    one, two = torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long)
    verify = torch.zeros(1, args.gamma + 1, dtype=torch.long)
    junk = torch.ones(512 * 2**20, dtype=torch.bfloat16)  # 1 GiB: more than both models and the L3
    times: dict[str, dict[str, list[float]]] = {kind: {"k=2": [], "k=1": []} for kind in KINDS}
    verify_ms: list[float] = []
    for _ in range(args.rounds):
        for kind in KINDS:
            if kind == "after a verify":
                verify_ms.append(ms(lambda: target.feed(verify)))
                target.uncache_last([args.gamma + 1])
            elif kind == "after a 1 GB read":
                junk.sum()
            times[kind]["k=2"].append(ms(lambda: draft.feed(two)))
            for _ in range(args.gamma - 1):
                times[kind]["k=1"].append(ms(lambda: draft.feed(one)))
            draft.uncache_last([args.gamma + 1])
    print(
        f"{hardware_label('cpu')}, {args.threads} thread(s), draft {args.draft}, γ {args.gamma}, capacity "
        f"{args.capacity}, prompt {args.prompt_tokens} tokens, {args.rounds} rounds (first {SKIP} dropped)"
    )
    for kind in KINDS:
        for k, values in times[kind].items():
            v = values[SKIP * (len(values) // args.rounds) :]  # every round adds the same count of each k
            deciles = statistics.quantiles(v, n=10)
            print(
                f"{kind:18s} {k}: median {statistics.median(v):6.2f} ms  p10 {deciles[0]:6.2f}  "
                f"p90 {deciles[-1]:6.2f}  (n = {len(v)})"
            )
    print(f"target verify k={args.gamma + 1}: median {statistics.median(verify_ms[SKIP:]):.2f} ms")


if __name__ == "__main__":
    main()

"""Where one compiled fast-path forward spends its time, kernel by kernel (torch.profiler).

    python scripts/profile_step.py [--model draft|target] [--draft w4a16] [--k 1] [--threads 2] [--steps 64]
                                   [--prompt-tokens 300] [--capacity N] [--concat-linears as-tagged|on|off]
                                   [--dtype bfloat16] [--compile-mode max-autotune] [--no-kernel-records]

Compiles the embedded target's (or a draft's) forward at k tokens with inductor's per-kernel
records on (`cpp.enable_kernel_profile`; off with `--no-kernel-records`), prefills a prompt, then profiles `--steps` forwards of
k tokens (the prefill is outside the profile). Prints the median step time and the kernels by
self time: GEMMs show as `gemm_m<k>n<out>k<in>`, fused pointwise/attention kernels as `cpp_fused_*`,
and `Call CompiledFxGraph`'s self time is the graph's wrapper between them (C++ on CPU, `compile_cache.CPP_WRAPPER`),
with the records' own cost: `--no-kernel-records` gives the step time the decoder sees. The figures behind the
fast path's inductor settings (`specbench.decoding.compile_cache.compiled_forward`) came from here.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch._inductor.config as inductor
from torch.profiler import ProfilerActivity, profile

from specbench.bench.envinfo import hardware_label
from specbench.config import DraftConfig, PairConfig
from specbench.decoding.forward import ForwardPath
from specbench.models.pair import load_pair


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("draft", "target"), default="draft")
    ap.add_argument("--draft", default="w4a16", help="draft.kind (a kind with a model)")
    ap.add_argument("--k", type=int, default=1, help="tokens per forward (a verify forward: gamma + 1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument(
        "--capacity", type=int, default=None, help="KV columns per row (default: just what the prompt and steps need)"
    )
    ap.add_argument("--rows", type=int, default=25, help="kernels listed")
    ap.add_argument("--dtype", default="bfloat16", help="pair.dtype (float32 puts W8A16/W4A16 on specbench's kernels)")
    ap.add_argument("--compile-mode", default="max-autotune", help="inductor mode (the bench's AVX2 runs use default)")
    ap.add_argument(
        "--concat-linears",
        choices=("as-tagged", "on", "off"),
        default="as-tagged",
        help="inductor's concatenated linears (q/k/v, gate/up): as the fast path decides (static_kv.concat_linears: "
        "W4A16 copies and fp32 models on), or forced",
    )
    ap.add_argument(
        "--no-kernel-records",
        action="store_true",
        help="inductor's per-kernel records off: under the C++ wrapper they lengthen the step by ~1.7 ms (the step time "
        "is then the decoder's; the fused pointwise kernels fold into the graph's self time)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    inductor.cpp.enable_kernel_profile = not args.no_kernel_records

    pair = load_pair(PairConfig(dtype=args.dtype), DraftConfig(kind=args.draft))
    model = pair.draft_model if args.model == "draft" else pair.target
    if model is None:
        raise SystemExit(f"--draft {args.draft!r} has no model to profile; use --model target or a model draft")
    if args.concat_linears != "as-tagged":  # before the compile, which reads the tag (`compile_cache.compiled_forward`)
        model.config.specbench_concat_linears = args.concat_linears == "on"
    need = args.prompt_tokens + args.k * (args.steps + 21) + 1
    if args.capacity is not None and args.capacity < need:
        raise SystemExit(f"--capacity {args.capacity}: the prompt and steps need {need} columns")
    fast = ForwardPath("compiled", args.compile_mode, args.capacity or need)
    print(f"compile seconds: {fast.warm_up(model, 1, [args.k]):.1f}", flush=True)
    lm = fast.lm(model)
    x = torch.zeros(1, args.k, dtype=torch.long)

    def steps(n: int) -> float:
        lm.prefill([list(range(100, 100 + args.prompt_tokens))])
        with torch.inference_mode():
            lm.feed(x)  # outside the timing: the first call after a prefill
            start = time.perf_counter()
            for _ in range(n):
                lm.feed(x)
        return (time.perf_counter() - start) / n

    times = sorted(steps(args.steps // 4) for _ in range(5))
    label = args.draft if args.model == "draft" else args.dtype
    print(f"{hardware_label('cpu')}, {args.threads} thread(s), {args.model} ({label}), k = {args.k}")
    print(f"step: median {times[2] * 1e3:.2f} ms (range {times[0] * 1e3:.2f}-{times[-1] * 1e3:.2f}, 5 blocks)")
    lm.prefill([list(range(100, 100 + args.prompt_tokens))])
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            lm.feed(x)
    print(f"per step, from {args.steps} profiled steps:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()

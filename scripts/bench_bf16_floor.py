"""C_t1 of the embedded bf16 target on the compiled fast path, torch's linears vs specbench's bf16 kernel, beside
the read floor, interleaved in one process.

    python scripts/bench_bf16_floor.py [--threads 2] [--blocks 5] [--steps 16] [--compile-mode default]
                                       [--ks 1] [--out DIR]

Two copies of the target (pair.cpu_linear=tuned): `torch` with specbench's kernel off (inductor's linears, as
before it) and `own` with it on from 1 to 8 rows (`CpuLinear.own_counts`), both compiled. Each block times --steps
one-row forwards of each copy in turn (a fresh prefill before each, outside the timing), then the read probe
(`bench_weight_stream`, 3 repeats). Writes `steps.csv`, `floor.csv` and `summary.md` (median ms per setting, the
read floor = target weight bytes ÷ the best read bandwidth, C_t1 ÷ floor, load averages) into --out.
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path

import pandas as pd
import torch

from specbench.analysis.floor import bandwidth_spread
from specbench.bench.envinfo import hardware_label
from specbench.bench.microbench import bench_weight_stream, streamed_weight_bytes
from specbench.config import DraftConfig, PairConfig
from specbench.decoding.forward import ForwardPath
from specbench.models import cpu_bf16
from specbench.models.kernels import OWN_PROBE_ROWS, CpuLinear
from specbench.models.pair import load_pair


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--ks", type=int, nargs="+", default=[1])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--compile-mode", default="default")
    ap.add_argument("--out", default="runs/bench_bf16_floor")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="ngram")).target
    models = {"torch": target, "own": copy.deepcopy(target)}
    for name, model in models.items():
        for m in model.modules():
            if isinstance(m, CpuLinear):
                m.own_counts = OWN_PROBE_ROWS if name == "own" else ()
    need = args.prompt_tokens + max(args.ks) * (args.steps + 4)
    lms = {}
    for name, model in models.items():
        fast = ForwardPath("compiled", args.compile_mode, need)
        print(f"{name}: compile {fast.warm_up(model, 1, args.ks):.1f} s", flush=True)
        lms[name] = fast.lm(model)
    prompt = [list(range(100, 100 + args.prompt_tokens))]
    steps, floors = [], []
    with torch.inference_mode():
        for block in range(args.blocks):
            for k in args.ks:
                x = torch.zeros(1, k, dtype=torch.long)
                for name, lm in lms.items():
                    lm.prefill(prompt)
                    lm.feed(x)  # the first call after a prefill: not timed
                    for step in range(args.steps):
                        start = time.perf_counter()
                        lm.feed(x)
                        steps.append((name, k, block, step, time.perf_counter() - start, os.getloadavg()[0]))
            for row in bench_weight_stream(torch.bfloat16, "cpu", repeats=3):
                floors.append({**row, "block": block})
            print(f"block {block} done, load {os.getloadavg()[0]:.1f}", flush=True)
    df = pd.DataFrame(steps, columns=["setting", "k", "block", "step", "t_forward", "load1"])
    df["hardware"], df["threads"], df["isa_path"] = hardware_label("cpu"), args.threads, cpu_bf16.isa_path()
    floor = pd.DataFrame(floors)
    df.to_csv(out / "steps.csv", index=False)
    floor.to_csv(out / "floor.csv", index=False)
    weight_bytes = streamed_weight_bytes(target)
    spread = bandwidth_spread(floor).set_index("probe")
    read_floor = weight_bytes / spread.loc["read", "bw_max"]
    lines = [
        "# C_t1 of the embedded bf16 target, compiled: torch's linears vs specbench's bf16 kernel",
        "",
        f"- hardware `{df.hardware.iloc[0]}`, ISA path `{df.isa_path.iloc[0]}`, {args.threads} thread(s), "
        f"compile mode {args.compile_mode}, context {args.prompt_tokens}+ tokens, {args.blocks} blocks x "
        f"{args.steps} steps per setting, interleaved; load average (1 min) while timed: "
        f"{df.load1.min():.1f}-{df.load1.max():.1f}",
        f"- target weight bytes read per step: {weight_bytes / 1e6:.0f} MB",
        "",
        "| probe | n | min GB/s | median GB/s | max GB/s | floor ms (bytes ÷ max) |",
        "|---|---|---|---|---|---|",
    ]
    for probe, r in spread.iterrows():
        lines.append(
            f"| {probe} | {r.n} | {r.bw_min / 1e9:.1f} | {r.bw_median / 1e9:.1f} | {r.bw_max / 1e9:.1f} "
            f"| {weight_bytes / r.bw_max * 1e3:.2f} |"
        )
    lines += ["", "| setting | k | median ms | block medians ms | C_t1 ÷ read floor |", "|---|---|---|---|---|"]
    for (name, k), g in df.groupby(["setting", "k"], sort=False):
        blocks = g.groupby("block")["t_forward"].median()
        lines.append(
            f"| {name} | {k} | {g.t_forward.median() * 1e3:.2f} | "
            f"{', '.join(f'{b * 1e3:.1f}' for b in blocks)} | {g.t_forward.median() / read_floor:.2f} |"
        )
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

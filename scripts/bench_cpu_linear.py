"""The tuned bf16 CPU linears (`pair.cpu_linear=tuned`) against torch's nn.Linear, on the eager path.

    python scripts/bench_cpu_linear.py [--threads 1] [--ks 1 2 4 6 9] [--steps 30] [--out DIR]

One process loads the embedded pair twice in bf16 (pair.cpu_linear=torch and =tuned) and times one
eager forward of k new tokens over a 200-token context, target and W8A16 draft, every (setting, model,
k) once per step in turn, so drift hits all alike. Each forward is rolled back (the context stays
fixed). Writes `steps.csv` (one row per timed forward) and `summary.md` (median ms per setting and
the per-step tuned / torch ratio with an exact 95% CI of its median) into --out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from specbench.analysis.stats import median_ci
from specbench.bench.envinfo import hardware_label
from specbench.config import DraftConfig, PairConfig
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.timing import PhaseTimer
from specbench.models.kernels import linear_kernels
from specbench.models.pair import load_pair

SETTINGS = ("torch", "tuned")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 6, 9])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--out", default="runs/bench_cpu_linear")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pairs = {s: load_pair(PairConfig(dtype="bfloat16", cpu_linear=s), DraftConfig(kind="w8a16")) for s in SETTINGS}
    context = [list(range(100, 100 + args.context))]
    lms = {}
    with torch.inference_mode():
        for s, pair in pairs.items():
            for model, m in (("target", pair.target), ("draft", pair.draft_model)):
                for k in args.ks if model == "target" else [1]:
                    lm = CachedLM(m)
                    lm.prefill(context)
                    lms[(s, model, k)] = lm
        timer, marks = PhaseTimer(), []
        for step in range(args.steps + 2):  # the first two steps warm up: not recorded
            for (s, model, k), lm in lms.items():
                start = timer.mark()
                lm.feed(torch.full((1, k), 5))
                end = timer.mark()
                lm.keep_last_fed(k, [0])
                if step >= 2:
                    marks.append((s, model, k, step, start, end))
    seconds = timer.resolve()
    df = pd.DataFrame(
        [(s, model, k, step, seconds[e] - seconds[b]) for s, model, k, step, b, e in marks],
        columns=["setting", "model", "k", "step", "t_forward"],
    )
    df["hardware"] = hardware_label("cpu")
    df["threads"] = args.threads
    df.to_csv(out / "steps.csv", index=False)
    wide = df.pivot_table(index=["model", "k", "step"], columns="setting", values="t_forward")
    lines = [
        "# Tuned bf16 CPU linears vs torch's nn.Linear (eager path)",
        "",
        f"- hardware `{df.hardware.iloc[0]}`, {args.threads} thread(s), embedded pair in bf16, context "
        f"{args.context} tokens, n = {args.steps} interleaved steps per row",
        f"- gemv rows per target shape: {linear_kernels(pairs['tuned'].target)}",
        "",
        "| model | k | torch ms | tuned ms | tuned / torch, median [95% CI] |",
        "|---|---|---|---|---|",
    ]
    for (model, k), g in wide.groupby(level=["model", "k"], sort=False):
        m, lo, hi = median_ci(g["tuned"] / g["torch"])
        lines.append(
            f"| {model} | {k} | {g['torch'].median() * 1e3:.1f} | {g['tuned'].median() * 1e3:.1f} "
            f"| {m:.2f}× [{lo:.2f}, {hi:.2f}] |"
        )
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

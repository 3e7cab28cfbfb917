"""Decoder benchmark for the closing notes: baseline vs speculative, interleaved in one run.

    python scripts/bench_decoder.py [--gamma 4] [--max-new-tokens 128] [--draft w8a16]

Runs one job through the Hydra app (embedded pair, bf16, B = 1, greedy, 8 built-in prompts)
and prints tokens/s of both decoders (median and IQR over prompts), the latency speedup
(`specbench.analysis.speedup.latency_speedup`: end to end and decode phase, exact CI of the
median, n), and C_d / C_t / C_o as shares of round time — all from the stored rows.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

from specbench.analysis.speedup import latency_speedup
from specbench.bench.runstore import load_sweep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft", default="w8a16")
    ap.add_argument("--runs-dir", default="runs")
    ap.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides")
    args = ap.parse_args()
    name = f"bench_decoder_g{args.gamma}_{args.draft}"
    cmd = [
        sys.executable,
        "-m",
        "specbench",
        f"gamma={args.gamma}",
        f"max_new_tokens={args.max_new_tokens}",
        f"draft={args.draft}",
        "workload.categories=[chat,code,summarization,qa]",
        "workload.limit_per_category=2",
        f"sweep_name={name}",
        f"runs_dir={args.runs_dir}",
        "force=true",
        *args.extra,
    ]
    subprocess.run(cmd, check=True)
    sweep = Path(args.runs_dir) / name
    req, rounds = load_sweep(sweep, "requests"), load_sweep(sweep, "rounds")
    req["tps"] = req.new_tokens / req.wall_time
    by = req.pivot_table(index=["prompt_id", "repeat"], columns="decoder", values="tps")
    for dec in ("autoregressive", "speculative"):
        q1, med, q3 = np.percentile(by[dec], [25, 50, 75])
        print(f"{dec:>15}: {med:6.1f} tok/s (IQR {q1:.1f}-{q3:.1f}) over {len(by)} prompts")
    # The one definition of the latency speedup (specbench.analysis.speedup), end to end and decode phase.
    for basis, what in (("wall", "end to end"), ("decode", "decode phase (TTFT left out)")):
        (row,) = latency_speedup(req, [], basis=basis).to_dict("records")
        print(
            f"latency speedup, {what}: {row['latency_speedup']:.2f}x "
            f"95% CI [{row['latency_speedup_lo']:.2f}, {row['latency_speedup_hi']:.2f}] n={row['n_prompts']}"
        )
    ttft = req.groupby("decoder").ttft.median() * 1e3
    print(f"median TTFT {ttft['autoregressive']:.0f} ms (AR) vs {ttft['speculative']:.0f} ms (speculative)")
    spec = rounds[rounds.decoder == "speculative"].drop_duplicates(["prompt_id", "repeat", "round"])
    total = spec.t_round.sum()
    print(
        f"round time shares: C_d {spec.t_draft.sum() / total:.1%}, C_t {spec.t_verify.sum() / total:.1%}, "
        f"C_o {spec.t_overhead.sum() / total:.1%}; mean accepted {spec.accepted.mean():.2f} of {args.gamma}"
    )
    ar = rounds[rounds.decoder == "autoregressive"].drop_duplicates(["prompt_id", "repeat", "round"])
    print(
        f"C_t1 (median AR step) {ar.t_round.median() * 1e3:.1f} ms; spec round median {spec.t_round.median() * 1e3:.1f} ms "
        f"(C_d {spec.t_draft.median() * 1e3:.1f}, C_t {spec.t_verify.median() * 1e3:.1f}, C_o {spec.t_overhead.median() * 1e3:.1f})"
    )


if __name__ == "__main__":
    main()

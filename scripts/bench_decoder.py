"""Decoder benchmark for the closing notes: baseline vs speculative, interleaved in one run.

    python scripts/bench_decoder.py [--gamma 4] [--max-new-tokens 128] [--draft w8a16]

Runs one job through the Hydra app (embedded pair, bf16, B = 1, greedy, 8 built-in prompts)
and prints tokens/s of both decoders (median and IQR over prompts), the paired speedup with
a bootstrap CI, and C_d / C_t / C_o as shares of round time — all from the stored rows.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
from scipy import stats

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
    ratio = (by.speculative / by.autoregressive).to_numpy()
    ci = stats.bootstrap((ratio,), np.median, confidence_level=0.95, random_state=0).confidence_interval
    print(
        f"speedup (median of paired per-prompt ratios): {np.median(ratio):.2f}x  95% CI [{ci.low:.2f}, {ci.high:.2f}]"
    )
    # Decode phase only: prefill (the target's and the draft's) is in TTFT and left out.
    req["decode_tps"] = (req.new_tokens - 1) / (req.wall_time - req.ttft)
    dec = req.pivot_table(index=["prompt_id", "repeat"], columns="decoder", values="decode_tps")
    d_ratio = (dec.speculative / dec.autoregressive).to_numpy()
    d_ci = stats.bootstrap((d_ratio,), np.median, confidence_level=0.95, random_state=0).confidence_interval
    print(
        f"decode-phase speedup: {np.median(d_ratio):.2f}x  95% CI [{d_ci.low:.2f}, {d_ci.high:.2f}]; "
        f"median TTFT {req[req.decoder == 'autoregressive'].ttft.median() * 1e3:.0f} ms (AR) vs "
        f"{req[req.decoder == 'speculative'].ttft.median() * 1e3:.0f} ms (spec: draft prefill included)"
    )
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

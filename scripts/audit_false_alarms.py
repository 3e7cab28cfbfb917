"""False-alarm rate of the lossless audit: how often does a *correct* decoder FAIL?

Two estimates, both at the audit's default settings (AuditSettings(): alpha = 0.01 family-wise,
4096 continuations of 4 tokens per prompt, the two tiny prompts, exact reference):

1. `--seeds N`: specbench's speculative decoder (gamma 2, the tiny float64 pair) audited
   with N different seeds (the whole pipeline: decoding, enumeration, tests, Holm);
2. `--calibration N`: continuations drawn directly from the enumerated target distribution
   (no model in the loop), N times: the statistics alone, cheap enough for many repetitions;
   `--calibration-mode sample` also draws the reference that way and runs the sample-mode
   G-tests instead of the exact-mode goodness of fit.

Holm controls the family-wise error at alpha, so both rates should be <= 1% (up to the
chi-square approximation). Prints the counts with exact (Clopper-Pearson) 95% intervals.

    python scripts/audit_false_alarms.py --seeds 200 --calibration 2000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from scipy import stats

from specbench.audit import (
    TINY_PROMPTS,
    AuditSettings,
    DecoderUnderTest,
    exact_distribution,
    run_audit,
    speculative_decoder,
    tiny_pair,
)
from specbench.decoding.sampling import SamplingConfig


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    a = (1 - level) / 2
    lo = stats.beta.ppf(a, k, n - k + 1) if k else 0.0
    hi = stats.beta.ppf(1 - a, k + 1, n - k) if k < n else 1.0
    return float(lo), float(hi)


def report(label: str, fails: int, runs: int, seconds: float) -> None:
    lo, hi = clopper_pearson(fails, runs)
    print(
        f"{label}: {fails}/{runs} false alarms = {fails / runs:.2%} (95% CI {lo:.2%}-{hi:.2%}), {seconds:.0f} s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100, help="full audits of the correct speculative decoder")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds run are first-seed .. first-seed + seeds - 1")
    parser.add_argument("--calibration", type=int, default=1000, help="audits of exact draws from p (no model)")
    parser.add_argument("--calibration-mode", choices=["exact", "sample", "both"], default="exact")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--gamma", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    target, draft = tiny_pair()
    prompts = [list(p) for p in TINY_PROMPTS]
    cache: dict = {}
    print(f"sampling {sampling}, gamma {args.gamma}, settings {AuditSettings()}", flush=True)

    if args.calibration:
        base = AuditSettings(bootstrap=0)
        exact = {tuple(p): exact_distribution(target, p, sampling, base.tokens) for p in prompts}

        def draw(prompt, n, tokens, seed):
            outcomes, probs = exact[tuple(prompt)]
            return outcomes[np.random.default_rng(seed).choice(len(probs), size=n, p=probs)]

        oracle = DecoderUnderTest("exact-draws", draw)
        modes = ["exact", "sample"] if args.calibration_mode == "both" else [args.calibration_mode]
        for mode in modes:
            start, fails, worst = time.perf_counter(), 0, []
            for seed in range(args.calibration):
                settings = AuditSettings(seed=10_000 + seed, bootstrap=0, reference=mode)
                result = run_audit(
                    target,
                    oracle,
                    prompts,
                    sampling,
                    set(),
                    settings,
                    reference=oracle,
                    cache=cache if mode == "exact" else {},
                )
                fails += not result.passed
                worst.append(result.summary.iloc[0].p_value)
            report(
                f"calibration, {mode} mode (draws from the enumerated p)",
                fails,
                args.calibration,
                time.perf_counter() - start,
            )
            print(f"  P(min Holm-adjusted p < 0.05) = {np.mean(np.array(worst) < 0.05):.2%}", flush=True)

    if args.seeds:
        start, fails, worst = time.perf_counter(), 0, []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            settings = AuditSettings(seed=seed, bootstrap=0)
            decoder = speculative_decoder(target, draft, args.gamma, sampling, set(), settings.batch_size)
            result = run_audit(target, decoder, prompts, sampling, set(), settings, cache=cache)
            fails += not result.passed
            worst.append(result.summary.iloc[0].p_value)
            if not result.passed:
                print(
                    f"  seed {seed}: FAIL at {result.summary.iloc[0].worst_test} "
                    f"(p_adj = {result.summary.iloc[0].p_value:.2g})",
                    flush=True,
                )
        report("speculative decoder", fails, args.seeds, time.perf_counter() - start)
        print(f"  P(min Holm-adjusted p < 0.05) = {np.mean(np.array(worst) < 0.05):.2%}", flush=True)


if __name__ == "__main__":
    main()

"""Validate the variable-draft-length cost model (specbench.analysis.policy_model) on the embedded pair.

Fit on runs that vary nothing but gamma (the plain decoder, fixed gamma 1, 2 and gamma_max): the
acceptance curve P(accept | q(x_i)) from the fixed gamma_max run's rows, the timing profile C_d, C_t(k),
C_o, C_t1 from all of them. Then predict `confidence_stop` at every tau of a grid, choose tau*, and
compare with held-out runs at those tau (never seen by the fit). Then n-gram lookup that proposes
nothing without a match (draft.ngram_fill=false): the model with and without the no-draft term.

Prompts: the first `--per-category` of each Spec-Bench category (13 at 1), chat-templated: at 4 prompts x 32
tokens two runs of the same command differed by 8 points of held-out error (sampling noise at T = 1).

python scripts/policy_cost_model.py --out analysis/draft_policies/cost_model  (eager path, fp32, 1 thread)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch

from specbench.analysis.policy_model import (
    choose_tau,
    fit_accept_curve,
    measured_policy,
    no_draft_share,
    predict_policy,
)
from specbench.analysis.timing import TimingProfile
from specbench.bench.workloads import SPEC_BENCH_ENV, default_spec_bench_path, prompt_ids, spec_bench_for_script
from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.drafts import ModelDraft, NgramDraft
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.policies import POLICIES
from specbench.decoding.records import ROUND_COLUMNS, to_frame
from specbench.decoding.sampling import SamplingConfig
from specbench.models.loading import eos_ids, load_model
from specbench.models.quant import quantize_w8a16


def run(target, make_draft, prompts, gamma, sampling, tokens, eos, seed, policy="fixed", tau=0.0):
    frames = []
    for i, ids in enumerate(prompts):
        g = torch.Generator().manual_seed(seed + i)
        if make_draft is None:
            r = autoregressive_decode(CachedLM(target), [ids], sampling, tokens, eos, g)
        else:
            r = speculative_decode(
                CachedLM(target), make_draft(), [ids], gamma, sampling, tokens, eos, g,
                policy=POLICIES.get(policy), tau=tau,
            )  # fmt: skip
        df = to_frame(r.rounds, ROUND_COLUMNS)
        df["prompt"] = i
        frames.append(df)
    out = pd.concat(frames, ignore_index=True)
    out["decoder"] = "autoregressive" if make_draft is None else "speculative"
    return out


class DraftFree:
    """The target's costs from a profile, with a model-free draft's own C_d (n-gram lookup: its median t_draft)."""

    def __init__(self, timing: TimingProfile, rounds: pd.DataFrame) -> None:
        self.timing, self.cd = timing, float(rounds.drop_duplicates(["prompt", "round"])["t_draft"].median())

    def c_d(self, gamma):
        return self.cd if gamma else 0.0

    def c_t(self, k):
        return self.timing.c_t(k)

    def c_o(self, gamma):
        return self.timing.c_o(gamma)

    def c_t1(self):
        return self.timing.c_t1()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--taus", type=float, nargs="+", default=[0.2, 0.4, 0.6, 0.8])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--per-category", type=int, default=1, help="Spec-Bench prompts per category")
    ap.add_argument(
        "--spec-bench", default=default_spec_bench_path(), help=f"default: ${SPEC_BENCH_ENV}, else %(default)s"
    )
    ap.add_argument("--out", default="analysis/draft_policies/cost_model")
    ap.add_argument("--rows", help="also write every run's round rows as parquet into this folder")
    args = ap.parse_args()
    chosen = spec_bench_for_script(args.spec_bench, limit_per_category=args.per_category)  # before any model loads
    torch.set_num_threads(args.threads)
    t0 = time.time()
    target, tok = load_model("embedded", dtype="float32")
    draft_model = quantize_w8a16(target)
    eos = eos_ids(tok, target)
    prompts = [prompt_ids(p, tok) for p in chosen]
    t1 = SamplingConfig(temperature=1.0)
    model = lambda: ModelDraft(draft_model)  # noqa: E731
    g_max = args.gamma

    runs = {}  # name -> round rows, for --rows
    ar = runs["plain"] = run(target, None, prompts, 0, t1, args.tokens, eos, 0)
    fixed = {g: run(target, model, prompts, g, t1, args.tokens, eos, 0) for g in sorted({1, 2, g_max})}
    runs.update({f"fixed_g{g}": df for g, df in fixed.items()})
    timing = TimingProfile.from_rounds(pd.concat([ar, *fixed.values()], ignore_index=True))
    curve = fit_accept_curve(fixed[g_max])
    grid = [round(0.05 * k, 2) for k in range(0, 20)]
    choice = choose_tau(fixed[g_max], curve, timing, "confidence_stop", grid, g_max, draft_stops=True)
    rows = []
    for tau in args.taus:
        held = runs[f"confidence_stop_{tau}"] = run(
            target, model, prompts, g_max, t1, args.tokens, eos, 0, "confidence_stop", tau
        )
        pred = predict_policy(fixed[g_max], curve, timing, "confidence_stop", tau, g_max, draft_stops=True)
        meas = measured_policy(held)
        meas["speedup"] = meas["accept_length"] * timing.c_t1() / meas["t_round"]
        rows.append({"tau": tau, **{f"pred_{k}": pred[k] for k in ("drafted", "accept_length", "t_round")},
                     "pred_speedup": pred["predicted_speedup"], **{f"meas_{k}": v for k, v in meas.items()}})  # fmt: skip
    held_out = pd.DataFrame(rows)
    for k in ("drafted", "accept_length", "t_round", "speedup"):
        held_out[f"err_{k}"] = held_out[f"pred_{k}"] / held_out[f"meas_{k}"] - 1

    # n-gram lookup proposing nothing without a match: the old model (every round drafts gamma) vs the new term
    ng_rows = []
    for g in sorted({2, 3, g_max}):
        ng = runs[f"ngram_g{g}"] = run(
            target, lambda: NgramDraft(target.config.vocab_size, fill=False), prompts, g, t1, args.tokens, eos, 0
        )
        share = no_draft_share(ng)
        ng_curve, ng_timing = fit_accept_curve(ng), DraftFree(timing, ng)
        # old: every round drafts gamma (fitted on the rounds that drafted); new: each round what it proposed
        old = predict_policy(ng[ng["drafted"] > 0], ng_curve, ng_timing, "fixed", 0.0, g, proposed=False)
        new = predict_policy(ng, ng_curve, ng_timing, "fixed", 0.0, g)
        meas = measured_policy(ng)
        for name, p in (("without term", old), ("with term", new)):
            speed = meas["accept_length"] * timing.c_t1() / meas["t_round"]
            ng_rows.append({"gamma": g, "model": name, "no_draft_share": share,
                            "pred_accept_length": p["accept_length"], "meas_accept_length": meas["accept_length"],
                            "err_accept_length": p["accept_length"] / meas["accept_length"] - 1,
                            "pred_t_round": p["t_round"], "meas_t_round": meas["t_round"],
                            "err_t_round": p["t_round"] / meas["t_round"] - 1,
                            "pred_speedup": p["predicted_speedup"], "meas_speedup": speed,
                            "err_speedup": p["predicted_speedup"] / speed - 1})  # fmt: skip
    ngram = pd.DataFrame(ng_rows)
    if args.rows:
        Path(args.rows).mkdir(parents=True, exist_ok=True)
        for name, df in runs.items():
            df.to_parquet(Path(args.rows) / f"{name}.parquet")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    curve.to_csv(out / "accept_curve.csv", index=False)
    choice.to_csv(out / "tau_choice.csv", index=False)
    held_out.to_csv(out / "held_out.csv", index=False)
    ngram.to_csv(out / "ngram.csv", index=False)
    summary = {
        "tau_star": float(choice.iloc[0]["tau"]),
        "tau_star_speedup": float(choice.iloc[0]["predicted_speedup"]),
        "median_abs_err_held_out": {
            k: float(held_out[f"err_{k}"].abs().median()) for k in ("drafted", "accept_length", "t_round", "speedup")
        },
        "ngram_median_abs_err": {
            k: ngram.groupby("model")[f"err_{k}"].apply(lambda s: s.abs().median()).to_dict()
            for k in ("accept_length", "t_round", "speedup")
        },
        "timing": {
            "ct1": timing.c_t1(),
            "cd": [timing.c_d(g) for g in range(g_max + 1)],
            "ct": [float(timing.c_t(k)) for k in range(1, g_max + 2)],
        },  # fmt: skip
        "prompts": len(prompts),
        "tokens": args.tokens,
        "seconds": time.time() - t0,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(curve, choice.head(5), held_out, ngram, json.dumps(summary, indent=1), sep="\n\n")


if __name__ == "__main__":
    main()

"""A draft-length policy against fixed γ on Spec-Bench prompts (one per category), paired in one process.

For each prompt and sampling (greedy, T = 1) the decoders run back to back in a rotating order with the
same seed: plain decoding, fixed γ, and each policy at γ_max = γ. Latency speedup per prompt = plain time
per token / speculative time per token; reported as the median over prompts with the exact order-statistic
CI (`analysis.stats.median_ci`), and the head-to-head policy / fixed γ per prompt the same way.

python scripts/policy_vs_fixed.py --out analysis/draft_policies/policy_vs_fixed  (embedded pair, W8A16 draft)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch

from specbench.analysis.stats import median_ci
from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.drafts import ModelDraft
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.policies import POLICIES
from specbench.decoding.sampling import SamplingConfig
from specbench.models.loading import eos_ids, load_model
from specbench.models.quant import quantize_w8a16

SAMPLINGS = {"greedy": SamplingConfig(), "T=1": SamplingConfig(temperature=1.0)}


def first_per_category(path: str, max_tokens: int, tok) -> list[tuple[str, list[int]]]:
    seen = {}
    for line in open(path, encoding="utf-8"):
        row = json.loads(line)
        if row["category"] not in seen:
            chat = [{"role": "user", "content": row["turns"][0]}]
            ids = list(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False))
            seen[row["category"]] = ids[-max_tokens:]
    return list(seen.items())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", default="/work/shared/data/spec_bench/question.jsonl")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--policy", action="append", default=None, help="name@tau (default confidence_stop@0.95, schedule)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="analysis/draft_policies/policy_vs_fixed")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target, tok = load_model("embedded", dtype="float32")
    draft_model = quantize_w8a16(target)
    eos = eos_ids(tok, target)
    prompts = first_per_category(a.questions, a.prompt_tokens, tok)
    specs = [("fixed", 0.0)] + [
        (n, float(t or 0)) for n, _, t in (p.partition("@") for p in (a.policy or ["confidence_stop@0.95", "schedule"]))
    ]

    def decode(name, tau, ids, sampling, seed):
        g = torch.Generator().manual_seed(seed)
        if name == "plain":
            r = autoregressive_decode(CachedLM(target), [ids], sampling, a.tokens, eos, g)
        else:
            r = speculative_decode(
                CachedLM(target), ModelDraft(draft_model), [ids], a.gamma, sampling, a.tokens, eos, g,
                policy=POLICIES.get(name), tau=tau,
            )  # fmt: skip
        req = r.requests[0]
        drafted = [x.drafted for x in r.rounds] or [0]
        return req.wall_time / req.new_tokens, sum(drafted) / len(drafted), req.new_tokens

    rows = []
    for s_name, sampling in SAMPLINGS.items():
        for i, (category, ids) in enumerate(prompts):
            order = [("plain", 0.0)] + specs
            order = order[i % len(order) :] + order[: i % len(order)]  # rotate: no decoder always runs first
            for name, tau in order:
                per_token, drafted, n = decode(name, tau, ids, sampling, 1000 + i)
                rows.append({"sampling": s_name, "category": category, "decoder": name, "tau": tau,
                             "s_per_token": per_token, "drafted": drafted, "new_tokens": n})  # fmt: skip
    df = pd.DataFrame(rows)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "requests.csv", index=False)
    table = []
    for s_name, sub in df.groupby("sampling"):
        # prompts whose every decode ran at least half the tokens (one that ends at once has no rounds to compare)
        full = sub.groupby("category")["new_tokens"].min() >= a.tokens // 2
        sub = sub[sub["category"].map(full)]
        wide = sub.pivot_table(index="category", columns="decoder", values="s_per_token")
        for name, _ in specs:
            med, lo, hi = median_ci(wide["plain"] / wide[name])
            h2h = median_ci(wide["fixed"] / wide[name]) if name != "fixed" else (float("nan"),) * 3
            table.append({"sampling": s_name, "decoder": name, "n": len(wide), "speedup": med, "lo": lo, "hi": hi,
                          "vs_fixed": h2h[0], "vs_fixed_lo": h2h[1], "vs_fixed_hi": h2h[2],
                          "drafted_per_round": float(sub[sub.decoder == name]["drafted"].mean())})  # fmt: skip
    summary = pd.DataFrame(table)
    summary.to_csv(out / "summary.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary)


if __name__ == "__main__":
    main()

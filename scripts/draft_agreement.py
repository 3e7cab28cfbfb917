"""How often a self-draft's greedy token is the target's, per draft variant: the acceptance a draft can reach.

    python scripts/draft_agreement.py [--prompts 16] [--max-new-tokens 96] [--skip 3] [--groups 32,128] [--out DIR]

The embedded target (bf16) writes its greedy continuation of --prompts Spec-Bench questions (every
30th of the file); each variant then reads prompt + continuation in one forward (teacher-forced) and
its argmax at every continuation position is compared with the target's. The share that agree is the
per-token acceptance of a greedy draft that has so far agreed (exact CI of a binomial proportion; the
tokens of one prompt are not independent, so read it as indicative; `prompt_lo` / `prompt_hi` resample whole
prompts instead). Variants: the weight-only copies (`w8a16`; `w4a16-g<G>` and `w4a16h8-g<G>`, int4 body and an int8
head, for each int4 group size G of --groups: at 32 the copy sits on the embedded target's own Q4_1 grid, so it
reproduces the target's weights; 128 is what GPTQ/AWQ checkpoints use) and layer-skipping self-drafts of the bf16 target,
layers removed greedily one at a time (each step drops the layer whose removal keeps agreement
highest; --skip steps). Writes agreement.csv (and per_prompt.csv: agreeing tokens per prompt and variant) into
--out and prints it.

by_confidence.csv: the same agreement per band of the variant's own confidence (its top probability at the
position). A draft that stops drafting below a confidence (llama.cpp's --spec-draft-p-min, transformers'
`assistant_confidence_threshold`) gives up the tokens of the low bands: it pays only where those agree rarely.
"""

from __future__ import annotations

import argparse
import copy
import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy.stats import binomtest
from torch import nn

from specbench.bench.envinfo import hardware_label
from specbench.bench.workloads import SPEC_BENCH_ENV, default_spec_bench_path, render_prompt, spec_bench_for_script
from specbench.config import DraftConfig, PairConfig
from specbench.models.draft_kinds import INT4_GROUPS
from specbench.models.pair import load_pair
from specbench.models.quant import quantize_w4a16, quantize_w8a16


def without_layers(model: nn.Module, drop: set[int]) -> nn.Module:
    """A copy of a decoder-only model (sharing its weights) without the layers in `drop`."""
    copied = copy.deepcopy(model, memo={id(t): t for t in (*model.parameters(), *model.buffers())})
    kept = [layer for i, layer in enumerate(copied.model.layers) if i not in drop]
    for i, layer in enumerate(kept):
        layer.self_attn.layer_idx = i  # a cache layer per kept layer
    copied.model.layers = nn.ModuleList(kept)
    copied.config.num_hidden_layers = len(kept)
    if getattr(copied.config, "layer_types", None):
        copied.config.layer_types = [t for i, t in enumerate(copied.config.layer_types) if i not in drop]
    return copied


CONFIDENCE_BANDS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.0)  # edges of the draft-confidence bands in by_confidence.csv
RESAMPLES = 2000  # prompt-bootstrap resamples


def weight_only_variants(groups: tuple[int, ...]) -> list[tuple[str, Callable[[nn.Module], nn.Module]]]:
    """(name, build from the target) per weight-only copy: W8A16, then W4A16 and W4A16 with an int8 head per group."""
    variants = [("w8a16", quantize_w8a16)]
    for group in groups:
        variants.append((f"w4a16-g{group}", functools.partial(quantize_w4a16, group=group)))
        variants.append((f"w4a16h8-g{group}", functools.partial(quantize_w4a16, head="int8", group=group)))
    return variants


def prompt_bootstrap(agree: np.ndarray, tokens: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95% percentile CI of the pooled share sum(agree) / sum(tokens), resampling prompts (their tokens together)."""
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(agree), size=(RESAMPLES, len(agree)))
    shares = agree[pick].sum(1) / tokens[pick].sum(1)
    return float(np.quantile(shares, 0.025)), float(np.quantile(shares, 0.975))


def parse_groups(text: str) -> tuple[int, ...]:
    """'32,128' -> (32, 128); each must be an int4 group size (`INT4_GROUPS`)."""
    groups = tuple(int(g) for g in text.split(",") if g)
    for g in groups:
        if g not in INT4_GROUPS:
            raise SystemExit(f"--groups: {g} is not an int4 group size; allowed: {list(INT4_GROUPS)}")
    return groups


def by_confidence(variant: str, agree: np.ndarray, confidence: np.ndarray) -> list[dict]:
    """Agreement per band (lo, hi] of the draft's top probability, with the exact binomial CI of each band."""
    band = np.searchsorted(CONFIDENCE_BANDS[1:-1], confidence)  # 0 .. len(CONFIDENCE_BANDS) - 2
    rows = []
    for i, (lo, hi) in enumerate(zip(CONFIDENCE_BANDS, CONFIDENCE_BANDS[1:])):
        hits = agree[band == i]
        if hits.size == 0:
            continue
        ci = binomtest(int(hits.sum()), hits.size).proportion_ci()
        rows.append(
            {
                "variant": variant,
                "confidence": f"({lo}, {hi}]",
                "tokens": hits.size,
                "token_share": hits.size / agree.size,
                "agree": float(hits.mean()),
                "lo": ci.low,
                "hi": ci.high,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--skip", type=int, default=3, help="layers removed greedily, one per step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--groups", type=parse_groups, default=(32, 128), help="int4 group sizes, comma-separated")
    ap.add_argument(
        "--spec-bench", default=default_spec_bench_path(), help=f"default: ${SPEC_BENCH_ENV}, else %(default)s"
    )
    ap.add_argument("--out", default="runs/draft_agreement")
    args = ap.parse_args()
    prompts = spec_bench_for_script(args.spec_bench)[::30][: args.prompts]  # before any model loads
    torch.set_num_threads(args.threads)
    pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="ngram"))
    target, tok = pair.target, pair.tokenizer
    seqs = []  # (prompt + greedy continuation [1, n], prompt length, the target's argmax at each position)
    with torch.inference_mode():
        for p in prompts:
            ids = tok(render_prompt(p, tok), add_special_tokens=False, return_tensors="pt")["input_ids"]
            out = target.generate(
                ids, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id
            )
            seqs.append((out, ids.shape[1], target(out).logits[0].argmax(-1)))

    def agreement(model: nn.Module, per_prompt: bool = False):
        """Per continuation position: whether the variant's argmax is the target's, and its top probability
        (with `per_prompt`, also each prompt's position count)."""
        agree, confidence = [], []
        with torch.inference_mode():
            for seq, start, ref in seqs:
                logits = model(seq, use_cache=False).logits[0, start - 1 : -1].float()
                agree.append((logits.argmax(-1) == ref[start - 1 : -1]).numpy())
                confidence.append(logits.softmax(-1).amax(-1).numpy())
        flat = np.concatenate(agree), np.concatenate(confidence)
        return (*flat, [a.size for a in agree]) if per_prompt else flat

    rows, bands, prompt_rows = [], [], []

    def record(variant: str, model: nn.Module) -> None:
        hits, confidence, sizes = agreement(model, per_prompt=True)
        agree, total = int(hits.sum()), hits.size
        ci = binomtest(agree, total).proportion_ci()
        per_prompt = np.array([int(a.sum()) for a in np.split(hits, np.cumsum(sizes)[:-1])])
        prompt_lo, prompt_hi = prompt_bootstrap(per_prompt, np.array(sizes))
        rows.append(
            {
                "variant": variant,
                "agree": agree,
                "tokens": total,
                "share": agree / total,
                "lo": ci.low,
                "hi": ci.high,
                "prompt_lo": prompt_lo,
                "prompt_hi": prompt_hi,
            }
        )
        prompt_rows.extend(
            {"variant": variant, "prompt": i, "agree": int(a), "tokens": n}
            for i, (a, n) in enumerate(zip(per_prompt, sizes))
        )
        bands.extend(by_confidence(variant, hits, confidence))
        print(f"{variant:>32}: {agree / total:.3f} [{ci.low:.3f}, {ci.high:.3f}] of {total}", flush=True)

    print(f"{hardware_label('cpu')}; {len(seqs)} prompts x {args.max_new_tokens} greedy tokens of the bf16 target")
    for name, build in weight_only_variants(args.groups):
        record(name, build(target))
    drop: set[int] = set()
    for _ in range(args.skip):
        left = [i for i in range(target.config.num_hidden_layers) if i not in drop]
        best = max(left, key=lambda i: int(agreement(without_layers(target, drop | {i}))[0].sum()))
        drop.add(best)
        record(f"bf16 without layers {sorted(drop)}", without_layers(target, drop))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "agreement.csv", index=False)
    pd.DataFrame(prompt_rows).to_csv(out / "per_prompt.csv", index=False)
    table = pd.DataFrame(bands)
    table.to_csv(out / "by_confidence.csv", index=False)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()

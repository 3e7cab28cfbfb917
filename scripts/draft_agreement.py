"""How often a self-draft's greedy token is the target's, per draft variant: the acceptance a draft can reach.

    python scripts/draft_agreement.py [--prompts 16] [--max-new-tokens 96] [--skip 3] [--out DIR]

The embedded target (bf16) writes its greedy continuation of --prompts Spec-Bench questions (every
30th of the file); each variant then reads prompt + continuation in one forward (teacher-forced) and
its argmax at every continuation position is compared with the target's. The share that agree is the
per-token acceptance of a greedy draft that has so far agreed (exact CI of a binomial proportion; the
tokens of one prompt are not independent, so read it as indicative). Variants: the weight-only copies
(`w8a16`, `w4a16`, `w4a16h8`: int4 body, int8 head) and layer-skipping self-drafts of the bf16 target,
layers removed greedily one at a time (each step drops the layer whose removal keeps agreement
highest; --skip steps). Writes agreement.csv into --out and prints it.

by_confidence.csv: the same agreement per band of the variant's own confidence (its top probability at the
position). A draft that stops drafting below a confidence (llama.cpp's --spec-draft-p-min, transformers'
`assistant_confidence_threshold`) gives up the tokens of the low bands: it pays only where those agree rarely.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy.stats import binomtest
from torch import nn

from specbench.bench.envinfo import hardware_label
from specbench.bench.workloads import SPEC_BENCH_ENV, default_spec_bench_path, render_prompt, spec_bench_for_script
from specbench.config import DraftConfig, PairConfig
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

    def agreement(model: nn.Module) -> tuple[np.ndarray, np.ndarray]:
        """Per continuation position: whether the variant's argmax is the target's, and its top probability."""
        agree, confidence = [], []
        with torch.inference_mode():
            for seq, start, ref in seqs:
                logits = model(seq, use_cache=False).logits[0, start - 1 : -1].float()
                agree.append((logits.argmax(-1) == ref[start - 1 : -1]).numpy())
                confidence.append(logits.softmax(-1).amax(-1).numpy())
        return np.concatenate(agree), np.concatenate(confidence)

    rows, bands = [], []

    def record(variant: str, model: nn.Module) -> None:
        hits, confidence = agreement(model)
        agree, total = int(hits.sum()), hits.size
        ci = binomtest(agree, total).proportion_ci()
        rows.append(
            {"variant": variant, "agree": agree, "tokens": total, "share": agree / total, "lo": ci.low, "hi": ci.high}
        )
        bands.extend(by_confidence(variant, hits, confidence))
        print(f"{variant:>32}: {agree / total:.3f} [{ci.low:.3f}, {ci.high:.3f}] of {total}", flush=True)

    print(f"{hardware_label('cpu')}; {len(seqs)} prompts x {args.max_new_tokens} greedy tokens of the bf16 target")
    record("w8a16", quantize_w8a16(target))
    record("w4a16", quantize_w4a16(target))
    record("w4a16h8", quantize_w4a16(target, head="int8"))
    drop: set[int] = set()
    for _ in range(args.skip):
        left = [i for i in range(target.config.num_hidden_layers) if i not in drop]
        best = max(left, key=lambda i: int(agreement(without_layers(target, drop | {i}))[0].sum()))
        drop.add(best)
        record(f"bf16 without layers {sorted(drop)}", without_layers(target, drop))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "agreement.csv", index=False)
    table = pd.DataFrame(bands)
    table.to_csv(out / "by_confidence.csv", index=False)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()

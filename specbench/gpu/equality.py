#!/usr/bin/env python
"""Greedy equality on shape-only models (`python -m specbench.gpu equality`; scripts/gpu_check.sh runs it).

`equality`: speculative vs autoregressive greedy decoding on shape-only models (random
weights, so no downloads), per dtype. In float32 the outputs must be identical; a
divergence is reported with the logit margin at the first differing token, computed
again in float32, so a numerics near-tie (DESIGN.md: bf16 verification of k tokens and
one-at-a-time decoding round differently) is told apart from a bug. Exit status 1 when
a float32 case diverges at a token whose float32 margin is not a tie.
"""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path

import torch

from specbench.bench.envinfo import hardware_label
from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.drafts import ModelDraft, NgramDraft
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.sampling import SamplingConfig
from specbench.models.loading import DTYPES
from specbench.models.shapes import build_shape_only_model, shape_config

GREEDY = SamplingConfig()
# A float32 divergence whose float32 margin is at most this is a numerics tie, not a bug.
FP32_TIE = 1e-3


def perturbed(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """A draft close to the target: its weights plus noise (partial, ragged acceptance)."""
    draft = copy.deepcopy(model)
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            noise = torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32)
            p.add_((noise * scale * p.float().std()).to(p.dtype))
    return draft


@torch.inference_mode()
def last_logits(model, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids], device=next(model.parameters()).device)
    return model(input_ids=x).logits[0, -1].float()


def ulp(dtype: torch.dtype, magnitude: float) -> float:
    """Spacing of `dtype` numbers at `magnitude` (the step a logit moves by)."""
    if magnitude <= 0:
        return torch.finfo(dtype).tiny
    mant = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52}[dtype]
    return 2.0 ** (math.floor(math.log2(magnitude)) - mant)


def divergence(
    model, reference32, prompt: list[int], ar: list[int], spec: list[int], dtype: torch.dtype
) -> dict | None:
    """None if equal; else the first differing position and the margins there.

    margin = logit[AR's token] - logit[speculative's token] at that position, from a plain
    forward in the run dtype and in float32 (`reference32`, the same weights upcast).
    """
    n = min(len(ar), len(spec))
    j = next((i for i in range(n) if ar[i] != spec[i]), None)
    if j is None:
        return None if len(ar) == len(spec) else {"position": n, "reason": "lengths differ (EOS)"}
    ctx = prompt + ar[:j]
    l_run, l32 = last_logits(model, ctx), last_logits(reference32, ctx)
    top = float(l32.abs().max())
    gap32 = float(l32[ar[j]] - l32[spec[j]])
    return {
        "position": j,
        "ar_token": ar[j],
        "spec_token": spec[j],
        "margin_run_dtype": float(l_run[ar[j]] - l_run[spec[j]]),
        "margin_fp32": gap32,
        "fp32_argmax": int(l32.argmax()),
        "max_abs_logit": top,
        "ulp_at_max_logit": ulp(dtype, top),
        "tie": abs(gap32) <= (FP32_TIE if dtype in (torch.float32, torch.float64) else 8 * ulp(dtype, top)),
    }


def run(args) -> int:
    device = torch.device(args.device)
    overrides = {"initializer_range": args.init_range} if args.init_range else {}
    if args.layers:
        overrides["num_hidden_layers"] = args.layers
    config = shape_config(args.shape, **overrides)
    reference32 = build_shape_only_model(config, dtype=torch.float32, device=device, seed=0)
    vocab = config.vocab_size
    g = torch.Generator().manual_seed(7)
    lengths = [args.prompt_tokens - 5 * i for i in range(args.batch)]  # ragged prompts
    prompts = [torch.randint(0, vocab, (max(n, 2),), generator=g).tolist() for n in lengths]
    cases, bad = [], 0
    for dtype_name in args.dtypes.split(","):
        dtype = DTYPES[dtype_name]
        model = reference32 if dtype == torch.float32 else copy.deepcopy(reference32).to(dtype)
        draft_model = perturbed(model, args.noise, seed=1)
        drafts = {"perturbed": lambda m=draft_model: ModelDraft(m), "ngram": lambda: NgramDraft(vocab, device=device)}
        t0 = time.perf_counter()
        ar = autoregressive_decode(CachedLM(model), prompts, GREEDY, args.new_tokens, set()).tokens
        hf = None
        if dtype == torch.float32:  # our baseline against transformers' own greedy decoding (no EOS either)
            saved, model.generation_config.eos_token_id = model.generation_config.eos_token_id, None
            try:
                with torch.inference_mode():
                    hf = [
                        model.generate(
                            x,
                            attention_mask=torch.ones_like(x),
                            max_new_tokens=args.new_tokens,
                            do_sample=False,
                            pad_token_id=0,
                        )[0, len(p) :].tolist()
                        for p in prompts
                        for x in [torch.tensor([p], device=device)]
                    ]
            finally:
                model.generation_config.eos_token_id = saved
        for draft_name, make in drafts.items():
            for gamma in args.gammas:
                result = speculative_decode(CachedLM(model), make(), prompts, gamma, GREEDY, args.new_tokens, set())
                rows = []
                for r, p in enumerate(prompts):
                    d = divergence(model, reference32, p, ar[r], result.tokens[r], dtype)
                    rows.append({"row": r, "equal": d is None, **({"divergence": d} if d else {})})
                accepted = [x.accepted for x in result.rounds]
                case = {
                    "shape": args.shape,
                    "layers": config.num_hidden_layers,
                    "dtype": dtype_name,
                    "draft": draft_name,
                    "gamma": gamma,
                    "batch": len(prompts),
                    "new_tokens": args.new_tokens,
                    "rows_equal": sum(x["equal"] for x in rows),
                    "rows": rows,
                    "mean_accepted": sum(accepted) / max(len(accepted), 1),
                    "host_syncs_per_round": sorted({x.host_syncs for x in result.rounds}),
                }
                # Only float32 decides: a non-tie divergence there is a bug; bf16/fp16 only report.
                exact = dtype in (torch.float32, torch.float64)
                case["ok"] = not exact or all(x["equal"] or x["divergence"].get("tie") for x in rows)
                bad += not case["ok"]
                cases.append(case)
                status = "ok" if case["ok"] else "FAIL"
                print(
                    f"[{status}] {dtype_name} draft={draft_name} γ={gamma}: {case['rows_equal']}/{len(rows)} rows "
                    f"equal, mean accepted {case['mean_accepted']:.2f}, syncs/round {case['host_syncs_per_round']}"
                    + (
                        "".join(
                            f"\n    row {x['row']}: first diff at {x['divergence'].get('position')}, "
                            f"fp32 margin {x['divergence'].get('margin_fp32', float('nan')):.3g}"
                            f" ({'tie' if x['divergence'].get('tie') else 'NOT a tie'})"
                            for x in rows
                            if not x["equal"]
                        )
                    ),
                    flush=True,
                )
        if hf is not None:  # our baseline vs transformers: equal, or apart only at a float32 tie
            hf_div = [divergence(model, reference32, p, h, a, dtype) for p, h, a in zip(prompts, hf, ar)]
            hf_ok = all(d is None or d.get("tie") for d in hf_div)
            cases.append(
                {
                    "dtype": dtype_name,
                    "check": "autoregressive vs transformers generate",
                    "ok": hf_ok,
                    "rows_equal": sum(d is None for d in hf_div),
                    "divergences": [d for d in hf_div if d],
                }
            )
            bad += not hf_ok
            print(
                f"[{'ok' if hf_ok else 'FAIL'}] {dtype_name}: autoregressive == transformers generate in "
                f"{sum(d is None for d in hf_div)}/{len(prompts)} rows (others at ties: {hf_ok})"
            )
        print(f"  {dtype_name}: {time.perf_counter() - t0:.1f} s", flush=True)
    out = {
        "device": str(device),
        "hardware": hardware_label(device),
        "ok": bad == 0,
        "fp32_tie": FP32_TIE,
        "cases": cases,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"greedy equality: {'PASS' if bad == 0 else f'FAIL ({bad} cases)'}")
    return 0 if bad == 0 else 1

"""Issue 11's must-show benchmark: the fast path against the reference and against transformers.

    python scripts/bench_fast_path.py [--gammas 3 5] [--drafts w8a16 w4a16+top16384] [--prompts 8] [--out DIR]

A draft is a `draft.kind`, optionally `+top<N>`: its head restricted to the N most frequent ids
(`draft.vocab_top`; counted over --vocab-corpus, else id order), and optionally `+ownkv`: a weight-only
copy that prefills the prompt itself rather than start from the target's KV (`draft.target_prompt_kv`), or
`+draftkv`: one that keeps its own K/V of the tokens it drafted (`draft.target_decode_kv=false`).
`ngram` runs as it is (no model to compile, no floor). transformers' assisted generation drives the first
draft listed (one with a model).

One process, embedded pair (bf16 unless --dtype), B = 1, greedy, --max-new-tokens 128. Every prompt
runs every decoder, in an order that rotates by prompt, so drift cannot favour any of them:
transformers `generate()` (target alone; with torch's nn.Linear as users run it, and on specbench's tuned
linears), transformers' assisted generation per γ (on the tuned linears), specbench's
eager reference (baseline and speculative at the first γ), and the compiled fast path (baseline, and
speculative per γ and draft). Compilation happens first and is timed apart. Writes `rows.csv`
(one row per prompt and decoder: raw counts and seconds) and `summary.md` (tok/s, per-prompt ratios
with exact CIs of the median, C_t1 / C_d beside the weight-streaming floors, C_o share, and the
cost model's ideal speedup at the floors) into --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from specbench.analysis.stats import median_ci
from specbench.bench.envinfo import environment_record, hardware_label
from specbench.bench.microbench import bench_weight_stream, streamed_weight_bytes
from specbench.bench.workloads import SPEC_BENCH_ENV, default_spec_bench_path, render_prompt, spec_bench_for_script
from specbench.config import DraftConfig, PairConfig
from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.forward import DRAFT_KS, ForwardPath, capacity_for, target_ks
from specbench.decoding.hf_assisted import hf_assisted_decode
from specbench.decoding.sampling import SamplingConfig
from specbench.decoding.timing import PhaseTimer
from specbench.models.pair import load_pair
from specbench.models.quant import kernel_sources

GREEDY = SamplingConfig()


def hf_generate(target, ids: list[int], max_new_tokens: int, eos: set[int]) -> dict:
    x = torch.tensor([ids])
    start = time.perf_counter()
    with torch.inference_mode():
        out = target.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(eos) or None,
            pad_token_id=0,
        )
    return {"wall": time.perf_counter() - start, "new_tokens": out.shape[1] - len(ids)}


def from_result(result) -> dict:
    (req,) = result.requests
    row = {"wall": req.wall_time, "ttft": req.ttft, "new_tokens": req.new_tokens, "rounds": len(result.rounds)}
    if result.rounds:
        r = pd.DataFrame([vars(x) for x in result.rounds])
        row |= {
            "t_draft": r.t_draft.sum(),
            "t_verify": r.t_verify.sum(),
            "t_overhead": r.t_overhead.sum(),
            "t_round": r.t_round.sum(),
            "drafted": r.gamma.sum(),
            "accepted": r.accepted.sum(),
            "committed": r.committed.sum(),
        }
    return row


OWN_KV = "+ownkv"  # a --drafts suffix: draft.target_prompt_kv=false (a weight-only copy prefills the prompt itself)
DRAFT_KV = "+draftkv"  # draft.target_decode_kv=false: the copy keeps its own K/V of the tokens it drafted


def draft_config(spec: str, corpus: str | None) -> DraftConfig:
    """`kind` or `kind+top<N>` (the row label's spelling), optionally with `+ownkv` or `+draftkv`, as a DraftConfig."""
    suffix = next((s for s in (OWN_KV, DRAFT_KV) if spec.endswith(s)), "")
    kind, _, top = spec.removesuffix(suffix).partition("+top")
    if top and not top.isdigit():
        raise SystemExit(f"--drafts {spec!r}: expected <kind>[+top<N>][{OWN_KV}|{DRAFT_KV}], N an integer")
    return DraftConfig(
        kind=kind,
        vocab_top=int(top or 0),
        vocab_corpus=corpus if top else None,
        target_prompt_kv=suffix != OWN_KV,
        target_decode_kv=suffix != DRAFT_KV,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gammas", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--drafts", nargs="+", default=["w8a16", "w4a16"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--compile-mode", default="max-autotune")
    ap.add_argument("--vocab-corpus", default=None, help="draft.vocab_corpus for the +top<N> drafts")
    ap.add_argument(
        "--spec-bench", default=default_spec_bench_path(), help=f"default: ${SPEC_BENCH_ENV}, else %(default)s"
    )
    ap.add_argument("--out", default="runs/bench_fast_path")
    ap.add_argument("--summarize", action="store_true", help="rewrite --out's summary.md from its rows and meta")
    args = ap.parse_args()
    if args.summarize:
        out = Path(args.out)
        meta = json.loads((out / "meta.json").read_text())
        df = pd.read_csv(out / "rows.csv")
        args.max_new_tokens = int(meta.get("max_new_tokens", args.max_new_tokens))
        args.threads = meta.get("threads", args.threads)
        summarize(
            df,
            out,
            args,
            meta["compile_seconds"],
            meta["bandwidth"],
            meta["weights"],
            meta["new_shapes"],
            meta.get("isa"),
        )
        return
    prompts = spec_bench_for_script(args.spec_bench, limit_per_category=1)[: args.prompts]  # before any model loads
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n = args.max_new_tokens

    pairs = {d: load_pair(PairConfig(dtype=args.dtype), draft_config(d, args.vocab_corpus)) for d in args.drafts}
    first = pairs[args.drafts[0]]
    if first.draft_model is None:
        raise SystemExit(
            f"--drafts {args.drafts[0]!r} first: it drives transformers' assisted generation, which needs a "
            "draft model; list a model draft (w8a16, w4a16) first"
        )
    tok, target, eos = first.tokenizer, first.target, first.eos
    ids = {p.prompt_id: tok(render_prompt(p, tok), add_special_tokens=False)["input_ids"] for p in prompts}
    capacity = capacity_for([len(v) for v in ids.values()], n, max(args.gammas))
    fast = ForwardPath("compiled", args.compile_mode, capacity)
    compile_s = {"target": fast.warm_up(target, 1, target_ks(*args.gammas))}
    for d, pair in pairs.items():
        if pair.draft_model is not None:  # an n-gram draft has no forward to compile
            compile_s[d] = fast.warm_up(pair.draft_model, 1, list(DRAFT_KS))
    print("compile seconds:", {k: round(v, 1) for k, v in compile_s.items()}, flush=True)

    # transformers as its users run it: torch's nn.Linear (the pair's target has specbench's tuned linears).
    plain = load_pair(PairConfig(dtype=args.dtype, cpu_linear="torch"), DraftConfig(kind="ngram")).target
    g0 = args.gammas[0]
    decoders = {
        "hf_generate": lambda i: hf_generate(plain, i, n, eos),
        "hf_generate:tuned_linear": lambda i: hf_generate(target, i, n, eos),
    }
    for g in args.gammas:
        decoders[f"hf_assisted:g{g}:{args.drafts[0]}"] = lambda i, g=g: from_result(
            hf_assisted_decode(target, first.draft_model, [i], g, GREEDY, n, eos, 0, PhaseTimer())
        )
    decoders["eager_ar"] = lambda i: from_result(autoregressive_decode(first.target_lm(), [i], GREEDY, n, eos))
    decoders[f"eager_spec:g{g0}:{args.drafts[0]}"] = lambda i: from_result(
        speculative_decode(first.target_lm(), first.new_draft(), [i], g0, GREEDY, n, eos)
    )
    decoders["fast_ar"] = lambda i: from_result(autoregressive_decode(fast.lm(target), [i], GREEDY, n, eos))
    for d, pair in pairs.items():
        fast_pair = dataclasses.replace(pair, forward=fast)  # its drafts run on the fast path
        for g in args.gammas:
            decoders[f"fast_spec:g{g}:{d}"] = lambda i, g=g, fast_pair=fast_pair: from_result(
                speculative_decode(fast.lm(target), fast_pair.new_draft(), [i], g, GREEDY, n, eos)
            )
    names = list(decoders)
    rows = []
    for j, (pid, i) in enumerate(ids.items()):
        order = names[j % len(names) :] + names[: j % len(names)]
        for name in order:
            rows.append({"prompt_id": pid, "decoder": name, "prompt_tokens": len(i), **decoders[name](i)})
        print(f"prompt {j + 1}/{len(ids)} done", flush=True)
    df = pd.DataFrame(rows)
    df["hardware"] = hardware_label("cpu")
    df.to_csv(out / "rows.csv", index=False)

    floor = pd.DataFrame(bench_weight_stream(target.dtype, "cpu"))
    bandwidth = {p: (g.probe_bytes / g.t_stream).median() for p, g in floor.groupby("probe")}
    weights = {"target": streamed_weight_bytes(target)} | {
        d: streamed_weight_bytes(p.draft_model) if p.draft_model is not None else 0 for d, p in pairs.items()
    }
    new_shapes = fast.new_shapes(target, *(p.draft_model for p in pairs.values() if p.draft_model is not None))
    meta = {
        "compile_seconds": compile_s,
        "bandwidth": bandwidth,
        "weights": weights,
        "new_shapes": new_shapes,
        "max_new_tokens": n,
        "threads": torch.get_num_threads(),
        "isa": environment_record()["cpu"]["isa"],
        "kernel_sources": {d: kernel_sources(p.draft_model) for d, p in pairs.items() if p.draft_model is not None},
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=float))
    summarize(df, out, args, compile_s, bandwidth, weights, new_shapes, meta["isa"])


def summarize(df, out, args, compile_s, bandwidth, weights, new_shapes, isa=None) -> None:
    df = df.assign(tps=df.new_tokens / df.wall)
    wide = df.pivot(index="prompt_id", columns="decoder", values="tps")
    isa = isa or environment_record()["cpu"]["isa"]
    lines = [
        "# Fast path benchmark",
        "",
        f"- hardware: `{df.hardware.iloc[0]}`; ISA flags {isa['flags']}; torch kernels "
        f"{isa['torch_capability']}; torch threads {args.threads or torch.get_num_threads()}",
        f"- embedded pair, {args.dtype}, B = 1, greedy, max_new_tokens {args.max_new_tokens}, n = {len(wide)} "
        "Spec-Bench prompts (one per category), every decoder on every prompt, order rotated by prompt",
        f"- compile seconds (before timing): {', '.join(f'{k} {v:.0f}' for k, v in compile_s.items())}; "
        f"shapes first met while timed: {new_shapes}",
        "",
        "| decoder | tok/s median | acceptance | E[N] | C_o share of round |",
        "|---|---|---|---|---|",
    ]
    for name in wide.columns:
        d = df[df.decoder == name]
        acc = d.accepted.sum() / d.drafted.sum() if "drafted" in d and d.drafted.sum() > 0 else np.nan
        en = d.committed.sum() / d.rounds.sum() if "committed" in d and d.committed.notna().all() else np.nan
        co = d.t_overhead.sum() / d.t_round.sum() if "t_round" in d and d.t_round.notna().all() else np.nan
        lines.append(f"| {name} | {wide[name].median():.1f} | {acc:.1%} | {en:.2f} | {co:.1%} |")
    hf_best = max((c for c in wide.columns if c.startswith("hf_assisted")), key=lambda c: wide[c].median())
    fast_best = max((c for c in wide.columns if c.startswith("fast_spec")), key=lambda c: wide[c].median())
    # The floors say how close a model draft comes to the hardware; an n-gram draft has none.
    model_best = max(
        (c for c in wide.columns if c.startswith("fast_spec") and weights[c.split(":")[2]]),
        key=lambda c: wide[c].median(),
    )
    lines += [
        "",
        f"Best fast speculative: `{fast_best}` (with a model draft: `{model_best}`); best transformers "
        f"assisted: `{hf_best}`.",
        "",
    ]
    lines += ["| ratio (per prompt, median [95% CI]) | value |", "|---|---|"]
    for num, den in (
        (fast_best, "fast_ar"),
        (fast_best, "hf_generate"),
        (fast_best, "hf_generate:tuned_linear"),
        ("eager_ar", "hf_generate"),
        (fast_best, hf_best),
        ("fast_ar", "eager_ar"),
        ("fast_ar", "hf_generate"),
        (fast_best, next(c for c in wide.columns if c.startswith("eager_spec"))),
        *([(model_best, "fast_ar"), (model_best, hf_best)] if model_best != fast_best else []),
    ):
        m, lo, hi = median_ci(wide[num] / wide[den])
        lines.append(f"| {num} / {den} | {m:.2f}× [{lo:.2f}, {hi:.2f}] |")
    # Per-step costs of the fast path against the weight-streaming floors.
    ar = df[df.decoder == "fast_ar"]
    ct1 = (ar.t_verify.sum()) / ar.rounds.sum()
    spec = df[df.decoder == model_best]
    gamma = int(model_best.split(":")[1][1:])
    draft = model_best.split(":")[2]
    cd_tok = spec.t_draft.sum() / spec.drafted.sum()
    ct_verify = spec.t_verify.sum() / spec.rounds.sum()
    en = spec.committed.sum() / spec.rounds.sum()
    lines += ["", "| cost | measured ms | floor ms (matvec probe) | floor ms (read probe) |", "|---|---|---|---|"]
    for what, t, w in (
        ("C_t1 (fast baseline step)", ct1, weights["target"]),
        (f"C_d per token ({draft})", cd_tok, weights[draft]),
    ):
        if not w:  # a draft with no weights (n-gram) has no floor
            lines.append(f"| {what} | {t * 1e3:.1f} | – | – |")
            continue
        fm, fr = w / bandwidth["matvec"], w / bandwidth["read"]
        lines.append(f"| {what} | {t * 1e3:.1f} | {fm * 1e3:.1f} ({t / fm:.2f}×) | {fr * 1e3:.1f} ({t / fr:.2f}×) |")
    lines.append(f"| C_t({gamma + 1}) verify | {ct_verify * 1e3:.1f} | | |")
    lines += [
        "",
        "Every fast speculative decoder: its draft's cost per drafted token against C_t1 and its floor.",
        "",
        "| decoder | acceptance | E[N] | C_d ms | c = C_d / C_t1 | C_d / matvec floor | C_t(γ+1) / C_t1 | vs fast_ar |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in (c for c in wide.columns if c.startswith("fast_spec")):
        d, dr = df[df.decoder == name], name.split(":")[2]
        cd, cv = d.t_draft.sum() / d.drafted.sum(), d.t_verify.sum() / d.rounds.sum()
        m, lo, hi = median_ci(wide[name] / wide["fast_ar"])
        over_floor = f"{cd / (weights[dr] / bandwidth['matvec']):.2f}×" if weights[dr] else "–"
        lines.append(
            f"| {name} | {d.accepted.sum() / d.drafted.sum():.1%} | {d.committed.sum() / d.rounds.sum():.2f} | "
            f"{cd * 1e3:.1f} | {cd / ct1:.2f} | {over_floor} | {cv / ct1:.2f} | {m:.2f}× [{lo:.2f}, {hi:.2f}] |"
        )
    for probe in ("matvec", "read"):
        ft, fd = weights["target"] / bandwidth[probe], weights[draft] / bandwidth[probe]
        ideal = en * ft / (gamma * fd + ct_verify)
        measured = wide[model_best].median() / wide["fast_ar"].median()
        lines.append(
            f"\nIdeal speedup at the {probe} floors (E[N] {en:.2f}, C_t1 and C_d at their floors, measured "
            f"C_t({gamma + 1})): {ideal:.2f}×; measured {measured:.2f}× = {measured / ideal:.0%} of it."
        )
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""The fast path against the eager reference on one device, side by side (`python -m specbench.gpu fastpath`).

Both paths decode the same prompts with the same target and draft, alternating eager and fast run by run, so
drift hits both alike; the fast path is compiled (on CUDA: CUDA graphs, `reduce-overhead`) and warmed up first,
its compile seconds reported apart. Per (path, decoder) it writes every run's tokens per second; the summary
is the fast/eager ratio of medians with the runs' spread, the new shapes met while timed (must be 0), whether
inductor skipped CUDA graphs (and why), and whether both paths gave the same greedy tokens.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from specbench.bench.envinfo import hardware_label
from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.drafts import ModelDraft
from specbench.decoding.forward import ForwardPath, capacity_for, target_ks
from specbench.decoding.sampling import SamplingConfig
from specbench.decoding.timing import PhaseTimer
from specbench.models.loading import DTYPES
from specbench.models.shapes import build_shape_only_model, shape_config

GREEDY = SamplingConfig()


def cudagraph_skips() -> dict[str, int]:
    """Inductor's counters of graphs it ran without CUDA graphs (reason -> count); {} when none."""
    from torch._dynamo.utils import counters

    return {k: v for k, v in counters["inductor"].items() if "cudagraph" in k and v}


def _decode(path: ForwardPath, target, draft, prompts, gamma: int, new_tokens: int, timer):
    lm = path.lm(target)
    if gamma == 0:
        return autoregressive_decode(lm, prompts, GREEDY, new_tokens, set(), timer=timer)
    return speculative_decode(
        lm, ModelDraft(draft, lm=path.lm(draft)), prompts, gamma, GREEDY, new_tokens, set(), timer=timer
    )


def compare(
    target_shape: str,
    draft_shape: str,
    device: str,
    dtype: torch.dtype,
    batch_sizes: list[int],
    gamma: int,
    new_tokens: int,
    prompt_tokens: int,
    repeats: int,
    compile_mode: str,
    layers: int | None = None,
) -> dict:
    """Eager vs fast, per batch size, for plain decoding (γ 0) and speculative decoding at `gamma`."""
    over = {"num_hidden_layers": layers} if layers else {}
    target = build_shape_only_model(shape_config(target_shape, **over), dtype=dtype, device=device, seed=0)
    draft = build_shape_only_model(shape_config(draft_shape, **over), dtype=dtype, device=device, seed=1)
    vocab = min(target.config.vocab_size, draft.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    out = {"hardware": hardware_label(torch.device(device)), "dtype": str(dtype).removeprefix("torch."),
           "target": target_shape, "draft": draft_shape, "gamma": gamma, "new_tokens": new_tokens,
           "compile_mode": compile_mode, "cases": []}  # fmt: skip
    for batch in batch_sizes:
        prompts = [torch.randint(0, vocab, (prompt_tokens,), generator=g).tolist() for _ in range(batch)]
        capacity = capacity_for([prompt_tokens], new_tokens, gamma)
        fast = (
            ForwardPath("static", capacity=capacity)
            if compile_mode == "none"
            else ForwardPath("compiled", compile_mode, capacity)
        )
        paths = {"eager": ForwardPath("eager"), "fast": fast}
        compile_s = paths["fast"].warm_up(target, batch, target_ks(gamma)) + paths["fast"].warm_up(draft, batch, [1, 2])
        for decoder_gamma in (0, gamma):
            runs: dict[str, list[float]] = {"eager": [], "fast": []}
            tokens: dict[str, list] = {}
            for _ in range(repeats + 1):  # the first of each path is a warm-up, dropped
                for name, path in paths.items():
                    timer = PhaseTimer(device)
                    begin = timer.mark()
                    result = _decode(path, target, draft, prompts, decoder_gamma, new_tokens, timer)
                    end = timer.mark()
                    seconds = timer.resolve()
                    runs[name].append(sum(len(t) for t in result.tokens) / (seconds[end] - seconds[begin]))
                    tokens[name] = result.tokens
            eager, fast = (statistics.median(runs[n][1:]) for n in ("eager", "fast"))
            ratios = sorted(f / e for e, f in zip(runs["eager"][1:], runs["fast"][1:]))
            case = {
                "batch_size": batch,
                "decoder": "autoregressive" if decoder_gamma == 0 else f"speculative γ={decoder_gamma}",
                "eager_tok_s": eager,
                "fast_tok_s": fast,
                "fast_over_eager": fast / eager,
                "paired_ratio_min_max": [ratios[0], ratios[-1]],
                "runs_tok_s": runs,
                "same_tokens": tokens["eager"] == tokens["fast"],
                "new_shapes_while_timed": paths["fast"].new_shapes(target, draft),
                "compile_seconds": compile_s,
            }
            out["cases"].append(case)
            print(
                f"  B={batch} {case['decoder']}: eager {eager:.1f} tok/s, fast {fast:.1f} tok/s, "
                f"{fast / eager:.2f}x (paired {ratios[0]:.2f}-{ratios[-1]:.2f}), same tokens {case['same_tokens']}, "
                f"new shapes {case['new_shapes_while_timed']}, compile {compile_s:.0f} s",
                flush=True,
            )
    out["cudagraph_skips"] = cudagraph_skips()
    return out


def run(args) -> int:
    result = compare(
        args.target_shape,
        args.draft_shape,
        args.device,
        DTYPES[args.dtype],
        args.batch_sizes,
        args.gamma,
        args.new_tokens,
        args.prompt_tokens,
        args.repeats,
        args.compile_mode,
        args.layers,
    )
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"cudagraph skips: {result['cudagraph_skips'] or 'none'}")
    bad = [c for c in result["cases"] if c["new_shapes_while_timed"]]
    return 1 if bad else 0

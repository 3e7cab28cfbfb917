"""transformers' engines: `generate()` on the target alone (its plain decoding) and its assisted
generation with the pair's draft (`specbench.decoding.hf_assisted`), both as transformers' users run
them: on torch's plain nn.Linear. The pair's models may carry specbench's tuned `CpuLinear`s
(pair.cpu_linear=tuned), so these engines load an untouched copy (`plain_models`)."""

from __future__ import annotations

import math

from specbench.decoding.records import AUTOREGRESSIVE, HF_ASSISTED, HF_GENERATE
from specbench.engines.base import TORCH, Engine, TorchSession, register
from specbench.engines.specbench_decoders import torch_costs

_PLAIN: dict[int, tuple] = {}  # id(pair.target) -> its plain copies: a tuner opens engines once per batch


def plain_models(cfg, pair):
    """(target, draft model) with torch's nn.Linear: the pair's own when it has no CpuLinear, else a
    copy loaded with pair.cpu_linear=torch at the pair's resolved dtype (kept for the pair's next opening)."""
    import dataclasses

    from specbench.models.kernels import linear_kernels
    from specbench.models.pair import load_pair

    tuned = linear_kernels(pair.target) or (pair.draft_model is not None and linear_kernels(pair.draft_model))
    if not tuned:
        return pair.target, pair.draft_model
    key = id(pair.target)
    if key not in _PLAIN or _PLAIN[key][0] is not pair.target:
        dtype = str(pair.target.dtype).removeprefix("torch.")
        plain = load_pair(dataclasses.replace(cfg.pair, cpu_linear="torch", dtype=dtype), pair.draft_cfg)
        _PLAIN.clear()  # one pair's copies at a time
        _PLAIN[key] = (pair.target, plain.target, plain.draft_model)
    return _PLAIN[key][1:]


def generate_decode(model, prompts, sampling, max_new_tokens: int, eos: set[int], seed: int, timer):
    """transformers' `generate()` on one prompt, specbench's sampling settings; a DecodeResult with its
    request row (TTFT at the streamer's first new token; `rounds` = target forwards, prefill included)."""
    import torch

    from specbench.decoding.decoder import DecodeResult
    from specbench.decoding.hf_assisted import FirstTokenMark, check_sampling, generate_kwargs
    from specbench.decoding.kvcache import cache_row_kv_bytes
    from specbench.decoding.records import RequestRecord

    if len(prompts) != 1:
        raise ValueError(f"batch_size={len(prompts)}: decoder='hf_generate' decodes one prompt per call (batch_size=1)")
    prompt = list(prompts[0])
    check_sampling(sampling, eos)
    forwards = [0]
    hook = model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    streamer = FirstTokenMark(timer)
    x = torch.tensor([prompt], device=model.device)
    try:
        torch.manual_seed(seed)
        start = timer.mark()
        with torch.inference_mode():
            out = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                streamer=streamer,
                return_dict_in_generate=True,
                **generate_kwargs(sampling, max_new_tokens, eos),
            )
        end = timer.mark()
    finally:
        hook.remove()
    new = out.sequences[0, len(prompt) :].tolist()
    cache = getattr(out, "past_key_values", None)
    seconds = timer.resolve()
    first = streamer.first_mark if streamer.first_mark is not None else end
    record = RequestRecord(
        row=0,
        prompt_tokens=len(prompt),
        new_tokens=len(new),
        rounds=forwards[0],
        wall_time=seconds[end] - seconds[start],
        ttft=seconds[first] - seconds[start],
        finished_by="eos" if new and new[-1] in eos else "max_new_tokens",
        first_chunk_tokens=streamer.first_chunk_tokens if streamer.first_mark is not None else len(new),
        kv_bytes_target=cache_row_kv_bytes(cache) if cache is not None else math.nan,
        kv_bytes_draft=0.0,
        t_draft_prefill=0.0,
    )
    return DecodeResult(tokens=[new], rounds=[], requests=[record])


def open_generate(cfg, pair, slot: int) -> TorchSession:
    from specbench.decoding.timing import PhaseTimer

    target, _ = plain_models(cfg, pair)
    sampling = cfg.sampling.build()
    return TorchSession(
        lambda ids, seed, n: generate_decode(target, ids, sampling, n, pair.eos, seed, PhaseTimer(target.device))
    )


def open_assisted(cfg, pair, slot: int) -> TorchSession:
    from specbench.decoding.hf_assisted import hf_assisted_decode
    from specbench.decoding.timing import PhaseTimer

    target, draft = plain_models(cfg, pair)
    sampling = cfg.sampling.build()
    return TorchSession(
        lambda ids, seed, n: hf_assisted_decode(
            target, draft, ids, cfg.gamma, sampling, n, pair.eos, seed, PhaseTimer(target.device)
        )
    )


def check_hf_sampling(cfg) -> None:
    """Settings transformers' generate cannot apply exactly (frequency / presence penalties)."""
    from specbench.decoding.hf_assisted import check_sampling

    check_sampling(cfg.sampling.build(), set())


register(
    Engine(
        HF_GENERATE,
        baseline=HF_GENERATE,
        runtime=TORCH,
        open=open_generate,
        description="transformers' generate() on the target alone, torch's nn.Linear: plain decoding as its users run it",
        batch_one=True,
        timed_rounds=False,  # generate() is one call: no round rows
        tunable=False,
        check=check_hf_sampling,
        costs=torch_costs,
    )
)
# Paired with specbench's autoregressive decoding, as its rows always were (analysis/ folders hold them);
# the engines view of the report also sets it against hf_generate, transformers' own plain decoding.
register(
    Engine(
        HF_ASSISTED,
        baseline=AUTOREGRESSIVE,
        runtime=TORCH,
        open=open_assisted,
        description="transformers' assisted generation: generate(assistant_model=the pair's draft), γ fixed, nn.Linear",
        needs_draft_model=True,
        batch_one=True,
        timed_rounds=False,  # generate() is one call: no round rows
        check=check_hf_sampling,
        costs=torch_costs,
    )
)

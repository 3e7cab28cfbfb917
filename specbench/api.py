"""`specbench.decode`: the decoder as a one-call Python API."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from specbench.bench.workloads import Prompt, render_prompt
from specbench.config import DraftConfig, ForwardConfig, ModelConfig, PairConfig
from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.forward import ForwardPath, capacity_for, check_context
from specbench.decoding.forward_choice import choose_for
from specbench.decoding.policies import POLICIES
from specbench.decoding.records import REQUEST_COLUMNS, ROUND_COLUMNS, to_frame
from specbench.decoding.sampling import SamplingConfig
from specbench.decoding.timing import PhaseTimer
from specbench.models.draft_kinds import AUTO, DRAFT_KINDS, resolve_kind
from specbench.models.pair import load_pair


@dataclass
class DecodeOutput:
    text: list[str]
    tokens: list[list[int]]
    rounds: pd.DataFrame  # one row per (round, row): raw counts and phase times
    requests: pd.DataFrame  # one row per prompt
    forward: str = ""  # the forward path that ran (forward='auto' resolved: eager, static or compiled)
    forward_reason: str = ""  # why forward='auto' chose it ("" when the path was named)


def decode(
    prompts: str | list[str],
    target: str = "embedded",
    draft: str = AUTO,
    draft_model: str | None = None,
    draft_vocab_top: int = 0,
    draft_target_prompt_kv: bool = True,
    draft_target_decode_kv: bool = True,
    gamma: int = 4,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    banned_token_ids: Sequence[int] = (),
    banned_sequences: Sequence[Sequence[int]] = (),
    max_new_tokens: int = 128,
    dtype: str = "auto",
    device: str = "cpu",
    seed: int = 0,
    speculative: bool = True,
    chat_template: bool = True,
    forward: str = "auto",
    compile_mode: str | None = None,
    cpu_linear: str = "tuned",
    draft_policy: str = "fixed",
    draft_tau: float = 0.0,
) -> DecodeOutput:
    """Decode a batch of prompts (one batch of B = len(prompts)) with speculative decoding,
    or the autoregressive baseline when `speculative=False`.

    `draft` is 'auto' (the measured default for this machine: `DEFAULT_DRAFTS`), 'w8a16' (int8 copy of the
    target), 'w4a16' (int4), 'w4a16h8' (int4, head in int8), 'ngram' (prompt lookup) or 'model' (then
    `draft_model` names it like `target`: 'embedded', a .gguf, a dir or a hub id).
    `draft_vocab_top` > 0 restricts a model draft's head to that many ids (`draft.vocab_top`).
    `draft_target_prompt_kv`: a weight-only copy starts from the target's KV of the prompt (`draft.target_prompt_kv`);
    `draft_target_decode_kv`: on the fast path, it also takes the target's K/V of each round's tokens (`draft.target_decode_kv`).
    Penalties and bans act per position on that position's own context (see `SamplingConfig`).
    `forward` is 'auto' (the default: 'compiled' where the fast path runs, on CPU with a working C++ compiler and
    on CUDA as CUDA graphs, else 'eager' with the reason in `forward_reason`; `specbench.decoding.forward_choice`),
    'eager' (the reference), 'static' or 'compiled' (the first call per batch size compiles the step and the
    verify, once per process: a first call costs compile time, later ones reuse the graphs). `compile_mode`: inductor's (`forward.compile_mode`;
    None: the config's default; auto on CUDA takes 'reduce-overhead').
    `cpu_linear` is 'tuned' (bf16 CPU linears in the kernel measured fastest per shape) or 'torch'.
    `draft_policy` / `draft_tau`: how many of the γ drafts a round verifies (`draft.policy`: 'fixed',
    'confidence_stop' (stop after a draft whose q(x_i) < tau), 'schedule', 'prune_renormalized'); γ is then γ_max.
    A prompt that with `max_new_tokens` would run past the target's context is refused (ValueError); a bad
    argument raises TypeError or ValueError naming it, before any model loads.
    """
    texts = _prompt_texts(prompts)
    _integer("gamma", gamma, 1 if speculative else 0)
    _integer("max_new_tokens", max_new_tokens, 1)
    _integer("seed", seed, 0)
    sampling = SamplingConfig(
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty,
        frequency_penalty,
        presence_penalty,
        tuple(banned_token_ids),
        tuple(tuple(s) for s in banned_sequences),
    )
    pair_cfg = PairConfig(
        name="api",
        target=ModelConfig(source=target),
        draft=ModelConfig(source=draft_model),
        dtype=dtype,
        device=device,
        cpu_linear=cpu_linear,
    )
    draft = resolve_kind(draft, device, dtype=dtype)
    # validates against DRAFT_KINDS
    draft_cfg = DraftConfig(
        kind=draft,
        vocab_top=draft_vocab_top,
        target_prompt_kv=draft_target_prompt_kv,
        target_decode_kv=draft_target_decode_kv,
        policy=draft_policy,
        tau=draft_tau,
    )
    # validates the path and the compile mode
    forward_cfg = ForwardConfig(path=forward, **({} if compile_mode is None else {"compile_mode": compile_mode}))
    if DRAFT_KINDS.get(draft, "draft").uses_pair_draft and not draft_model:
        raise ValueError(f"draft={draft!r} needs draft_model (a model id, .gguf file or directory)")
    pair = load_pair(pair_cfg, draft_cfg)
    if chat_template:
        texts = [
            render_prompt(Prompt(str(i), "api", [{"role": "user", "content": t}]), pair.tokenizer)
            for i, t in enumerate(texts)
        ]
    ids = [pair.tokenizer(t, add_special_tokens=not chat_template)["input_ids"] for t in texts]
    check_context({f"{i} (prompts[{i}])": len(x) for i, x in enumerate(ids)}, max_new_tokens, pair.target)
    capacity = capacity_for([len(i) for i in ids], max_new_tokens, gamma)
    chosen = choose_for(forward_cfg.path, forward_cfg.compile_mode, device, *pair.configs())
    pair.forward = ForwardPath.chosen(chosen, capacity)
    generator = torch.Generator(device=pair.target.device).manual_seed(seed)
    timer = PhaseTimer(pair.target.device)
    if speculative:
        policy = POLICIES.get(draft_cfg.policy, "draft_policy")
        result = speculative_decode(
            pair.target_lm(), pair.new_draft(), ids, gamma, sampling, max_new_tokens, pair.eos, generator, timer,
            policy=policy, tau=draft_cfg.tau,
        )  # fmt: skip
    else:
        result = autoregressive_decode(pair.target_lm(), ids, sampling, max_new_tokens, pair.eos, generator, timer)
    return DecodeOutput(
        text=pair.tokenizer.batch_decode(result.tokens, skip_special_tokens=True),
        tokens=result.tokens,
        rounds=to_frame(result.rounds, ROUND_COLUMNS),
        requests=to_frame(result.requests, REQUEST_COLUMNS),
        forward=chosen.path,
        forward_reason=chosen.reason,
    )


def _integer(name: str, value, low: int) -> None:
    """TypeError unless `value` is an integer, ValueError unless it is >= `low`; both name the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}={value!r}: must be an integer >= {low}, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name}={value!r}: must be an integer >= {low}")


def _prompt_texts(prompts) -> list[str]:
    """`prompts` as a non-empty list of non-empty strings (a lone string is a batch of one)."""
    if isinstance(prompts, str):
        prompts = [prompts]
    elif not isinstance(prompts, Sequence):
        raise TypeError(f"prompts={prompts!r:.80}: must be a str or a list of str, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError(f"prompts={list(prompts)!r}: must hold at least one prompt (a str or a list of str)")
    for i, text in enumerate(prompts):
        if not isinstance(text, str):
            raise TypeError(f"prompts[{i}]={text!r:.80}: every prompt must be a str, got {type(text).__name__}")
        if not text.strip():
            raise ValueError(f"prompts[{i}]={text!r}: a prompt must not be empty")
    return list(prompts)

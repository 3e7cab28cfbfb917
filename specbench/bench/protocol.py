"""The one benchmark protocol, shared by sweep jobs (`specbench.bench.job`) and tuner trials
(`specbench.tune.runner`), so their rows mean the same thing.

* warm-up: the first `warmup` batches, every decoder, 16 tokens; never recorded;
* seeds: batch i of repeat r decodes with ``seed + 1_000_003 * r + i``, the same for every decoder;
* order: decoders alternate which goes first ((r + i) even: the baseline), so drift hits both alike;
* rows: round and request rows labelled with the job keys, prompt id and category, decoder,
  repeat and batch (request rows also carry `gamma`: the setting for speculative rows, 0 for AR);
* C_t(k): target-forward micro-benchmark rows labelled with hardware, dtype, target, pair, shape_only;
* floor: the weight-streaming probe and both models' weight bytes, labelled the same plus draft;
* telemetry: every measured decode call runs under NVML telemetry (`JobTelemetry`; a no-op off CUDA).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pandas as pd
import torch

from specbench.bench.envinfo import hardware_label
from specbench.bench.microbench import bench_target_forward, bench_weight_stream, streamed_weight_bytes
from specbench.bench.telemetry import JobTelemetry
from specbench.config import Config
from specbench.decoding.decoder import DecodeResult, autoregressive_decode, speculative_decode
from specbench.decoding.forward import target_ks
from specbench.decoding.policies import POLICIES
from specbench.decoding.records import (
    AUTOREGRESSIVE,
    BASELINE_OF,
    BASELINES,
    HF_ASSISTED,
    LLAMA_CPP,
    LLAMA_CPP_DECODERS,
    REQUEST_COLUMNS,
    ROUND_COLUMNS,
    to_frame,
)
from specbench.decoding.timing import PhaseTimer
from specbench.models.draft_kinds import DRAFT_KINDS
from specbench.models.pair import Pair

SEED_STRIDE = 1_000_003  # seed step between repeats: batches of different repeats never share a seed
WARMUP_TOKENS = 16
CT_KEYS = ("hardware", "dtype", "forward", "target", "pair", "shape_only")  # what the cost model matches C_t(k) rows on


@dataclass
class EncodedPrompt:
    """One prompt as token ids, with the ids that label its rows."""

    prompt_id: str
    category: str
    ids: list[int]


def batches_of(prompts: list[EncodedPrompt], batch_size: int) -> list[list[EncodedPrompt]]:
    """Consecutive prompt batches of `batch_size` (the last may be shorter)."""
    return [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]


def batch_seed(seed: int, repeat: int, batch: int) -> int:
    """The seed of one (repeat, batch): every decoder gets the same one."""
    return seed + SEED_STRIDE * repeat + batch


def decoders(cfg: Config, baseline: bool | None = None) -> list[str]:
    """Decoders a job runs, baselines first: each engine's plain decoder (`BASELINE_OF`: specbench's
    autoregressive for speculative and hf_assisted, llama.cpp's for llama_cpp), then cfg.decoder and
    *cfg.extra_decoders (without the baselines when `baseline` is off).

    γ = 0 is "speculation off": the plain decoders alone (a speedup over itself is 1 by definition).
    """
    bases = list(dict.fromkeys(BASELINE_OF[d] for d in cfg.all_decoders))
    if cfg.gamma == 0:
        return bases
    with_ar = cfg.baseline if baseline is None else baseline
    return [*bases, *cfg.all_decoders] if with_ar else cfg.all_decoders


def decoder_keys(cfg: Config, name: str) -> dict:
    """Job keys that differ for one decoder: llama.cpp's rows name its GGUF types, not the torch pair's."""
    if name not in LLAMA_CPP_DECODERS:
        return {}
    lc = cfg.llama_cpp
    keys = {"dtype": lc.row_dtype}
    if name == LLAMA_CPP:
        # draft_kind: the DRAFT_KINDS name of what llama.cpp drafts with (a model, or n-gram lookup)
        keys |= {"draft": lc.row_draft, "draft_kind": "ngram" if lc.draft_is_ngram else "model"}
    return keys


def decoder_order(names: list[str], repeat: int, batch: int) -> list[str]:
    """Alternate which decoder goes first, so slow drift favours neither."""
    return list(names) if (repeat + batch) % 2 == 0 else list(names)[::-1]


def job_keys(cfg: Config, pair: Pair) -> dict:
    """Columns every row of a job (or trial) carries, so rows group without joins."""
    target = cfg.pair.target.shape or cfg.pair.target.source
    kind = DRAFT_KINDS.get(cfg.draft.kind, "draft.kind")
    return {
        "pair": cfg.pair.name,
        "target": target,
        "draft": kind.row_label(target, cfg.pair, cfg.draft),
        "draft_kind": cfg.draft.kind,
        "shape_only": pair.shape_only or bool(kind.uses_pair_draft and cfg.pair.draft.shape),
        "workload": cfg.workload.name,
        "context_tokens": cfg.workload.context_tokens,  # None unless prompts were padded to a length
        "sampling": cfg.sampling.name,
        "temperature": float(cfg.sampling.temperature),
        "top_k": cfg.sampling.top_k,
        "top_p": float(cfg.sampling.top_p),
        "min_p": float(cfg.sampling.min_p),
        "repetition_penalty": float(cfg.sampling.repetition_penalty),
        "frequency_penalty": float(cfg.sampling.frequency_penalty),
        "presence_penalty": float(cfg.sampling.presence_penalty),
        "banned": len(cfg.sampling.banned_token_ids) + len(cfg.sampling.banned_sequences),  # ids + sequences
        "batch_size": cfg.batch_size,
        "gamma_setting": cfg.gamma,
        "max_new_tokens": cfg.max_new_tokens,
        "dtype": str(pair.target.dtype).removeprefix("torch."),
        "forward": cfg.forward.row_label(cfg.pair.cpu_linear),
        "device": cfg.pair.device,
        "hardware": hardware_label(cfg.pair.device),
    }


def label_rows(df: pd.DataFrame, batch: list[EncodedPrompt], keys: dict, extra: dict) -> pd.DataFrame:
    """Add prompt id/category (by batch row) and the job keys + `extra` (decoder, repeat, batch, gamma)."""
    df["prompt_id"] = [batch[r].prompt_id for r in df["row"]]
    df["category"] = [batch[r].category for r in df["row"]]
    for k, v in {**keys, **extra}.items():
        if k != "gamma" or k not in df:  # round rows carry their own per-round gamma
            df[k] = v
    return df


def decode_batch(
    cfg: Config, pair: Pair, decoder: str, ids: list[list[int]], seed: int, max_new_tokens: int, servers=None
) -> DecodeResult:
    """One batch with one decoder; every decoder gets the same seed for the same batch.
    `servers`: the job's running llama-servers (`specbench.llama_cpp.servers.JobServers`)."""
    sampling = cfg.sampling.build()
    if decoder in LLAMA_CPP_DECODERS:
        from specbench.llama_cpp.decoder import llama_cpp_decode

        if servers is None:
            raise ValueError(f"decoder={decoder!r} needs the job's llama-servers (JobServers)")
        return llama_cpp_decode(servers[decoder], ids, sampling, max_new_tokens, seed)
    generator = torch.Generator(device=pair.target.device).manual_seed(seed)
    timer = PhaseTimer(pair.target.device)
    if decoder == AUTOREGRESSIVE:
        return autoregressive_decode(pair.target_lm(), ids, sampling, max_new_tokens, pair.eos, generator, timer)
    if decoder == HF_ASSISTED:
        from specbench.decoding.hf_assisted import hf_assisted_decode  # transformers' generate: loaded on use

        return hf_assisted_decode(
            pair.target, pair.draft_model, ids, cfg.gamma, sampling, max_new_tokens, pair.eos, seed, timer
        )
    return speculative_decode(
        pair.target_lm(),
        pair.new_draft(),
        ids,
        cfg.gamma,
        sampling,
        max_new_tokens,
        pair.eos,
        generator,
        timer,
        policy=POLICIES.get(cfg.draft.policy, "draft.policy"),
        tau=cfg.draft.tau,
    )


def warm_up(cfg: Config, pair: Pair, names: list[str], batches: list[list[EncodedPrompt]], servers=None) -> float:
    """Decode the first `cfg.warmup` batches with every decoder (allocator, kernels, caches); never
    recorded. Returns the seconds it took (Σ batch walls)."""
    seconds = 0.0
    for b in batches[: cfg.warmup]:
        for name in names:
            tokens = min(WARMUP_TOKENS, cfg.max_new_tokens)
            r = decode_batch(cfg, pair, name, [p.ids for p in b], cfg.seed, tokens, servers)
            seconds += max((q.wall_time for q in r.requests), default=0.0)
    return seconds


def measure_batch(
    cfg: Config,
    pair: Pair,
    keys: dict,
    names: list[str],
    index: int,
    batch: list[EncodedPrompt],
    repeat: int,
    telemetry: JobTelemetry,
    servers=None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One measured (repeat, batch): every decoder in alternating order, same seed, under telemetry.
    Returns labelled (round rows, request rows)."""
    seed = batch_seed(cfg.seed, repeat, index)
    ids = [p.ids for p in batch]
    rounds, requests = [], []
    for name in decoder_order(names, repeat, index):
        result = telemetry.run(
            functools.partial(decode_batch, cfg, pair, name, ids, seed, cfg.max_new_tokens, servers),
            decoder=name,
            repeat=repeat,
            batch=index,
        )
        gamma = 0 if name in BASELINES else cfg.gamma
        extra = {**decoder_keys(cfg, name), "decoder": name, "repeat": repeat, "batch": index, "gamma": gamma}
        rounds.append(label_rows(to_frame(result.rounds, ROUND_COLUMNS), batch, keys, extra))
        requests.append(label_rows(to_frame(result.requests, REQUEST_COLUMNS), batch, keys, extra))
    return pd.concat(rounds, ignore_index=True), pd.concat(requests, ignore_index=True)


def bench_ct(cfg: Config, pair: Pair, keys: dict, prompts: list[EncodedPrompt], ks: range) -> pd.DataFrame:
    """C_t(k) rows at the job's batch size and the prompts' mean length, labelled with `CT_KEYS`."""
    context = int(sum(len(p.ids) for p in prompts) / max(1, len(prompts)))
    if pair.forward.mode is not None:  # only the shapes the job compiled: a new k would compile here
        ks = target_ks(cfg.gamma)
    lm = pair.target_lm()
    ct = pd.DataFrame(bench_target_forward(pair.target, cfg.batch_size, ks, context, seed=cfg.seed, lm=lm))
    for k in CT_KEYS:
        ct[k] = keys[k]
    return ct


def bench_floor(pair: Pair, keys: dict) -> pd.DataFrame:
    """Streaming-bandwidth probe rows with the target's and the draft's weight bytes (the hardware
    floor of a decode step: `specbench.analysis.floor.hardware_limit`), labelled with `CT_KEYS` + draft."""
    floor = pd.DataFrame(bench_weight_stream(pair.target.dtype, pair.target.device))
    floor["target_weight_bytes"] = streamed_weight_bytes(pair.target)
    floor["draft_weight_bytes"] = streamed_weight_bytes(pair.draft_model)
    for k in (*CT_KEYS, "draft"):
        floor[k] = keys[k]
    return floor

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

import pandas as pd

from specbench.bench.costs import CT_KEYS, bench_ct, bench_floor  # noqa: F401  (the protocol's cost rows)
from specbench.bench.envinfo import hardware_label
from specbench.bench.telemetry import JobTelemetry
from specbench.bench.workloads import EncodedPrompt
from specbench.config import Config
from specbench.decoding.decoder import DecodeResult
from specbench.decoding.records import REQUEST_COLUMNS, ROUND_COLUMNS, to_frame
from specbench.engines import ENGINES, Session, engine, open_engines
from specbench.models.draft_kinds import DRAFT_KINDS
from specbench.models.pair import Pair

SEED_STRIDE = 1_000_003  # seed step between repeats: batches of different repeats never share a seed
WARMUP_TOKENS = 16


def batch_seed(seed: int, repeat: int, batch: int) -> int:
    """The seed of one (repeat, batch): every decoder gets the same one."""
    return seed + SEED_STRIDE * repeat + batch


def decoders(cfg: Config, baseline: bool | None = None) -> list[str]:
    """Engines a job runs, baselines first: each engine's baseline (`Engine.baseline`: specbench's
    autoregressive for speculative and hf_assisted, llama.cpp's for llama_cpp), then cfg.decoder and
    *cfg.extra_decoders (without the baselines when `baseline` is off; a plain engine listed there runs anyway).

    γ = 0 is "speculation off": the plain engines alone (a speedup over itself is 1 by definition).
    """
    bases = list(dict.fromkeys(engine(d).baseline for d in cfg.all_decoders))
    if cfg.gamma == 0:
        return bases
    with_ar = cfg.baseline if baseline is None else baseline
    return list(dict.fromkeys([*bases, *cfg.all_decoders])) if with_ar else cfg.all_decoders


def decoder_keys(cfg: Config, name: str) -> dict:
    """Job keys that differ for one engine (`Engine.row_keys`: llama.cpp's rows name its GGUF types)."""
    return engine(name).row_keys(cfg)


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
    cfg: Config, pair: Pair, decoder: str, ids: list[list[int]], seed: int, max_new_tokens: int, sessions=None
) -> DecodeResult:
    """One batch with one engine; every engine gets the same seed for the same batch.
    `sessions`: the job's open engines (`specbench.engines.open_engines`); None: opened for this call."""
    if sessions is None:
        with open_engines(cfg, pair, [decoder]) as opened:
            return opened[decoder].decode(ids, seed, max_new_tokens)
    return sessions[decoder].decode(ids, seed, max_new_tokens)


def warm_up(
    cfg: Config, pair: Pair, names: list[str], batches: list[list[EncodedPrompt]], sessions: dict | None = None
) -> float:
    """Decode the first `cfg.warmup` batches with every engine (allocator, kernels, caches); never
    recorded. Returns the seconds it took (Σ batch walls)."""
    if sessions is None:
        with open_engines(cfg, pair, names) as opened:
            return warm_up(cfg, pair, names, batches, opened)
    seconds = 0.0
    for b in batches[: cfg.warmup]:
        for name in names:
            tokens = min(WARMUP_TOKENS, cfg.max_new_tokens)
            r = decode_batch(cfg, pair, name, [p.ids for p in b], cfg.seed, tokens, sessions)
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
    sessions: dict[str, Session] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One measured (repeat, batch): every engine in alternating order, same seed, under telemetry.
    Returns labelled (round rows, request rows)."""
    if sessions is None:
        with open_engines(cfg, pair, names) as opened:
            return measure_batch(cfg, pair, keys, names, index, batch, repeat, telemetry, opened)
    seed = batch_seed(cfg.seed, repeat, index)
    ids = [p.ids for p in batch]
    rounds, requests = [], []
    for name in decoder_order(names, repeat, index):
        result = telemetry.run(
            functools.partial(decode_batch, cfg, pair, name, ids, seed, cfg.max_new_tokens, sessions),
            decoder=name,
            repeat=repeat,
            batch=index,
        )
        gamma = cfg.gamma if ENGINES.get(name).speculative else 0
        extra = {**decoder_keys(cfg, name), "decoder": name, "repeat": repeat, "batch": index, "gamma": gamma}
        rounds.append(label_rows(to_frame(result.rounds, ROUND_COLUMNS), batch, keys, extra))
        requests.append(label_rows(to_frame(result.requests, REQUEST_COLUMNS), batch, keys, extra))
    return pd.concat(rounds, ignore_index=True), pd.concat(requests, ignore_index=True)

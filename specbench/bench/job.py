"""One sweep job: load, warm up, then decode the workload with the baseline and the
speculative decoder interleaved batch by batch (same seeds), and store raw rows.

The job protocol is what makes paired speedups trustworthy: drift on the machine
hits both decoders alike, and the first batch's one-off costs are not recorded.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from specbench.bench import runstore
from specbench.config import Config
from specbench.decoding.decoder import DecodeResult, autoregressive_decode, speculative_decode
from specbench.bench.envinfo import environment_record, hardware_label
from specbench.decoding.kvcache import CachedLM
from specbench.bench.microbench import bench_target_forward
from specbench.models.draft_kinds import DRAFT_KINDS
from specbench.models.pair import Pair, load_pair
from specbench.decoding.records import AUTOREGRESSIVE, HF_ASSISTED, REQUEST_COLUMNS, ROUND_COLUMNS, SPECULATIVE, to_frame
from specbench.bench.telemetry import JobTelemetry
from specbench.decoding.timing import PhaseTimer
from specbench.bench.workloads import Prompt, load_workload, render_prompt

log = logging.getLogger(__name__)


@dataclass
class EncodedPrompt:
    prompt_id: str
    category: str
    ids: list[int]


def encode_workload(cfg: Config, pair: Pair) -> list[EncodedPrompt]:
    """The workload's prompts as token ids (chat template applied), or synthetic ids."""
    w = cfg.workload
    check_shape_only_workload(cfg)
    if w.kind == "synthetic":
        g = torch.Generator().manual_seed(w.seed or 0)
        vocab = pair.target.config.vocab_size
        return [
            EncodedPrompt(f"synthetic-{i:02d}", "synthetic", torch.randint(0, vocab, (w.prompt_tokens,), generator=g).tolist())
            for i in range(w.n_prompts)
        ]
    if pair.tokenizer is None:
        raise ValueError(
            f"workload.kind={w.kind!r} needs a tokenizer, but pair {cfg.pair.name!r} is shape-only; "
            "use workload=synthetic with shape-only models"
        )
    prompts: list[Prompt] = load_workload(w.kind, w.path, w.categories, w.limit_per_category, w.seed)
    encoded = []
    for p in prompts:
        text = render_prompt(p, pair.tokenizer)
        encoded.append(EncodedPrompt(p.prompt_id, p.category, pair.tokenizer(text, add_special_tokens=False)["input_ids"]))
    return encoded


def check_shape_only_workload(cfg: Config) -> None:
    """Shape-only models have no tokenizer (and meaningless text): they need workload=synthetic.

    Checked before any model loads, so a misconfigured 8B-shape job fails in milliseconds.
    """
    shaped = [f"pair.{name}.shape={m.shape!r}" for name, m in (("target", cfg.pair.target), ("draft", cfg.pair.draft))
              if m.shape and (name == "target" or DRAFT_KINDS.get(cfg.draft.kind).uses_pair_draft)]  # fmt: skip
    if shaped and cfg.workload.kind != "synthetic":
        raise ValueError(
            f"workload.kind={cfg.workload.kind!r} needs a tokenizer, but pair {cfg.pair.name!r} is shape-only "
            f"({', '.join(shaped)}: random weights, no tokenizer); use workload=synthetic with shape-only models"
        )


def decode_batch(cfg: Config, pair: Pair, decoder: str, ids: list[list[int]], seed: int, max_new_tokens: int) -> DecodeResult:
    """One batch with one decoder; every decoder gets the same seed for the same batch."""
    sampling = cfg.sampling.build()
    device = pair.target.device
    generator = torch.Generator(device=device).manual_seed(seed)
    timer = PhaseTimer(device)
    if decoder == AUTOREGRESSIVE:
        return autoregressive_decode(CachedLM(pair.target), ids, sampling, max_new_tokens, pair.eos, generator, timer)
    if decoder == HF_ASSISTED:
        from specbench.decoding.hf_assisted import hf_assisted_decode

        return hf_assisted_decode(pair.target, pair.draft_model, ids, cfg.gamma, sampling, max_new_tokens, pair.eos, seed, timer)
    return speculative_decode(CachedLM(pair.target), pair.new_draft(), ids, cfg.gamma, sampling,
                              max_new_tokens, pair.eos, generator, timer)  # fmt: skip


def job_keys(cfg: Config, pair: Pair) -> dict:
    """Columns every row of this job carries, so a sweep's rows can be grouped without joins."""
    target = cfg.pair.target.shape or cfg.pair.target.source
    kind = DRAFT_KINDS.get(cfg.draft.kind, "draft.kind")
    draft = kind.label(target, cfg.pair, cfg.draft)
    return {
        "pair": cfg.pair.name, "target": target, "draft": draft, "draft_kind": cfg.draft.kind,
        "shape_only": pair.shape_only or bool(kind.uses_pair_draft and cfg.pair.draft.shape),
        "workload": cfg.workload.name, "sampling": cfg.sampling.name,
        "temperature": float(cfg.sampling.temperature), "top_k": cfg.sampling.top_k,
        "top_p": float(cfg.sampling.top_p), "batch_size": cfg.batch_size, "gamma_config": cfg.gamma,
        "max_new_tokens": cfg.max_new_tokens, "dtype": str(pair.target.dtype).removeprefix("torch."),
        "device": cfg.pair.device, "hardware": hardware_label(cfg.pair.device),
    }  # fmt: skip


def run_job(cfg: Config, job_dir: Path, resolved_yaml: str | None = None) -> bool:
    """Run one job into `job_dir`; returns False when it was already done (skip-if-done)."""
    if not runstore.prepare_job_dir(job_dir, force=cfg.force):
        log.info("skip %s: already done", job_dir)
        return False
    try:
        _run(cfg, job_dir, resolved_yaml)
    except Exception as exc:  # recorded, then the sweep goes on with the next job
        runstore.write_failure(job_dir, exc)
        log.error("job %s failed (%s): %s", job_dir, "oom" if runstore.is_oom(exc) else "error", exc)
        raise
    return True


def _run(cfg: Config, job_dir: Path, resolved_yaml: str | None) -> None:
    runstore.write_text(job_dir, "config.yaml", resolved_yaml or OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    runstore.write_json(job_dir, "env", environment_record())
    check_shape_only_workload(cfg)
    pair = load_pair(cfg.pair, cfg.draft)
    prompts = encode_workload(cfg, pair)
    keys = job_keys(cfg, pair)
    spec_name = HF_ASSISTED if cfg.decoder == HF_ASSISTED else SPECULATIVE
    decoders = [AUTOREGRESSIVE, spec_name] if cfg.baseline else [spec_name]
    batches = [prompts[i : i + cfg.batch_size] for i in range(0, len(prompts), cfg.batch_size)]

    for b in batches[: cfg.warmup]:  # warm-up: allocator, kernels, caches; never recorded
        for decoder in decoders:
            decode_batch(cfg, pair, decoder, [p.ids for p in b], cfg.seed, min(16, cfg.max_new_tokens))

    rounds, requests = [], []
    telemetry = JobTelemetry(str(pair.target.device))
    steps = [(r, i) for r in range(cfg.repeats) for i in range(len(batches))]
    for repeat, i in tqdm(steps, desc=f"{job_dir.name or 'job'}", unit="batch", leave=False):
        batch = batches[i]
        seed = cfg.seed + 1_000_003 * repeat + i
        # Alternate which decoder goes first so slow drift does not favour either.
        for decoder in decoders if (repeat + i) % 2 == 0 else decoders[::-1]:
            result = telemetry.run(lambda: decode_batch(cfg, pair, decoder, [p.ids for p in batch], seed,
                                                        cfg.max_new_tokens), decoder=decoder, repeat=repeat, batch=i)
            extra = {"decoder": decoder, "repeat": repeat, "batch": i, "gamma": cfg.gamma if decoder != AUTOREGRESSIVE else 0}
            rounds.append(_label(to_frame(result.rounds, ROUND_COLUMNS), batch, keys, extra))
            requests.append(_label(to_frame(result.requests, REQUEST_COLUMNS), batch, keys, extra))

    rounds_df, requests_df = pd.concat(rounds, ignore_index=True), pd.concat(requests, ignore_index=True)
    runstore.write_table(job_dir, "rounds", rounds_df)
    runstore.write_table(job_dir, "requests", requests_df)
    if cfg.ct_bench:
        context = int(sum(len(p.ids) for p in prompts) / len(prompts))
        ct = pd.DataFrame(bench_target_forward(pair.target, cfg.batch_size, range(1, 17), context, seed=cfg.seed))
        for k in ("hardware", "dtype", "target", "pair", "shape_only"):
            ct[k] = keys[k]
        runstore.write_table(job_dir, "ct", ct)
    meta = telemetry.write(job_dir)
    runstore.mark_done(job_dir, {**keys, "prompts": len(prompts), "batches": len(batches), "repeats": cfg.repeats,
                                 "telemetry": meta})  # fmt: skip


def _label(df: pd.DataFrame, batch: list[EncodedPrompt], keys: dict, extra: dict) -> pd.DataFrame:
    df["prompt_id"] = [batch[r].prompt_id for r in df["row"]]
    df["category"] = [batch[r].category for r in df["row"]]
    for k, v in {**keys, **extra}.items():
        if k != "gamma" or k not in df:  # round rows carry their own gamma
            df[k] = v
    return df

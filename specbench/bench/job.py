"""One sweep job: load, encode the workload, run the benchmark protocol
(`specbench.bench.protocol`: warm-up, paired interleaved batches, telemetry, C_t(k)) and
store the raw rows in the run store.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from specbench.bench import claims, runstore
from specbench.bench.envinfo import environment_record
from specbench.bench.jobkeys import JobConflict, config_diff, machine_key, machine_record
from specbench.bench.memory import PeakMemory
from specbench.bench.protocol import decoders, job_keys, measure_batch, warm_up
from specbench.bench.telemetry import JobTelemetry
from specbench.bench.workloads import (
    EncodedPrompt,
    Prompt,
    batches_of,
    context_documents,
    load_workload,
    pad_to_tokens,
    prompt_ids,
)
from specbench.config import Config
from specbench.decoding.forward import DECODE_KV_DRAFT_KS, DRAFT_KS, ForwardPath, capacity_for, check_context
from specbench.decoding.forward_choice import choose_for
from specbench.engines import ENGINES, SERVER, open_engines, runs_in
from specbench.llama_cpp.servers import llama_threads
from specbench.models import choices
from specbench.models.draft_kinds import AUTO, DRAFT_KINDS, device_refusal, draft_class, resolve_kind, takes_decode_kv
from specbench.models.kernels import linear_kernels
from specbench.models.loading import fastest_cpu_dtype
from specbench.models.pair import Pair, load_pair
from specbench.models.quant import kernel_choices, kernel_sources

log = logging.getLogger(__name__)
CT_KS = range(1, 17)  # k of the per-job C_t(k) micro-benchmark


def check_workload(cfg: Config) -> list[Prompt] | None:
    """Read and check the workload before any model loads: the shape-only rule, the file (every line; a
    missing, malformed or non-UTF-8 file names itself and the line) and a batch size the prompts can fill.
    Returns the prompts (None for synthetic ids, made once the vocabulary is known)."""
    w = cfg.workload
    check_shape_only_workload(cfg)
    if w.kind == "synthetic":  # the config checked n_prompts >= batch_size
        return None
    prompts = load_workload(w.kind, w.path, w.categories, w.limit_per_category, w.seed)
    if len(prompts) < cfg.batch_size:
        raise ValueError(
            f"batch_size={cfg.batch_size}: the {w.kind} workload {w.path or ''} selects only {len(prompts)} prompts, "
            "so no batch of that size would run; lower batch_size or select more prompts"
        )
    if w.context_tokens is not None:
        context_documents(w.kind, w.path)  # has long passages to pad with
    return prompts


def encode_workload(cfg: Config, pair: Pair, prompts: list[Prompt] | None = None) -> list[EncodedPrompt]:
    """The workload's prompts as token ids (chat template applied), or synthetic ids; `prompts`: those
    `check_workload` read (None: read them here). Refuses a prompt that would run past the target's context."""
    encoded = _encode(cfg, pair, prompts)
    check_context({p.prompt_id: len(p.ids) for p in encoded}, cfg.max_new_tokens, pair.target)
    return encoded


def _encode(cfg: Config, pair: Pair, prompts: list[Prompt] | None) -> list[EncodedPrompt]:
    w = cfg.workload
    check_shape_only_workload(cfg)
    if w.kind == "synthetic":
        g = torch.Generator().manual_seed(w.seed or 0)
        vocab = pair.target.config.vocab_size
        return [
            EncodedPrompt(
                f"synthetic-{i:02d}", "synthetic", torch.randint(0, vocab, (w.prompt_tokens,), generator=g).tolist()
            )
            for i in range(w.n_prompts)
        ]
    if pair.tokenizer is None:
        raise ValueError(
            f"workload.kind={w.kind!r} needs a tokenizer, but pair {cfg.pair.name!r} is shape-only; "
            "use workload=synthetic with shape-only models"
        )
    if prompts is None:
        prompts = load_workload(w.kind, w.path, w.categories, w.limit_per_category, w.seed)
    if w.context_tokens is not None:  # the context-length sweep: prompts lengthened with real passages
        docs = context_documents(w.kind, w.path)
        return [
            EncodedPrompt(p.prompt_id, p.category, pad_to_tokens(p, pair.tokenizer, w.context_tokens, docs))
            for p in prompts
        ]
    return [EncodedPrompt(p.prompt_id, p.category, prompt_ids(p, pair.tokenizer)) for p in prompts]


def check_shape_only_workload(cfg: Config) -> None:
    """Shape-only models have no tokenizer (and meaningless text): they need workload=synthetic.

    Checked before any model loads, so a misconfigured 8B-shape job fails in milliseconds.
    """
    shaped = [
        f"pair.{name}.shape={m.shape!r}"
        for name, m in (("target", cfg.pair.target), ("draft", cfg.pair.draft))
        if m.shape and (name == "target" or DRAFT_KINDS.get(cfg.draft.kind).uses_pair_draft)
    ]
    if shaped and cfg.workload.kind != "synthetic":
        raise ValueError(
            f"workload.kind={cfg.workload.kind!r} needs a tokenizer, but pair {cfg.pair.name!r} is shape-only "
            f"({', '.join(shaped)}: random weights, no tokenizer); use workload=synthetic with shape-only models"
        )


def auto_dtype_record(cfg: Config) -> dict:
    """`pair.dtype=auto` on CPU: the choice and the probe's seconds (`fastest_cpu_dtype`, the same
    call `load_pair` made, read from the machine's choices cache, so the record is the choice the job ran)."""
    if cfg.pair.dtype != "auto" or cfg.pair.device != "cpu":
        return {}
    weights = DRAFT_KINDS.get(cfg.draft.kind, "draft.kind").weights
    chosen, seconds = fastest_cpu_dtype(weights, cfg.pair.cpu_linear)
    return {"auto_dtype": {"chosen": chosen, "probe_seconds": seconds}}


def auto_choices_record(cfg: Config) -> dict:
    """Every auto choice the job's process made or read (`choices.record`: dtype, gemv and kernel rows, with
    their timings, the cache file and its machine key) and what draft.kind=auto picks on this machine."""
    return {
        "auto_choices": {
            **choices.record(),
            "draft_kind": {
                "kind": cfg.draft.kind,
                "auto": resolve_kind(AUTO, cfg.pair.device, cfg.needs_draft_model, cfg.pair.dtype),
                "cpu_class": draft_class(cfg.pair.device, cfg.pair.dtype),
            },
        }
    }


def set_forward_path(cfg: Config, pair: Pair, prompts: list[EncodedPrompt]) -> dict[str, float]:
    """Put the job's forward path on the pair and compile every shape its decoders will run, before
    anything is timed (target: k = 1 and γ + 1; draft: k = 1 and 2, or 1 alone on the target's decode K/V).
    Returns seconds per model."""
    chosen = choose_for(cfg.forward.path, cfg.forward.compile_mode, cfg.pair.device, *pair.configs())
    cfg.forward = f = replace(cfg.forward, path=chosen.path, compile_mode=chosen.compile_mode)  # rows: what ran
    capacity = f.capacity or capacity_for([len(p.ids) for p in prompts], cfg.max_new_tokens, cfg.gamma)
    pair.forward = ForwardPath.chosen(chosen, capacity)
    draft_ks = DECODE_KV_DRAFT_KS if takes_decode_kv(pair) else DRAFT_KS
    if pair.forward.mode is not None:  # a cold compile takes minutes: say so before the wait, not after
        log.info("forward.path=%s: compiling the target's and the draft's forwards (cached for later jobs)", f.label)
    seconds = pair.forward.warm_up_pair(pair.target, pair.draft_model, cfg.batch_size, cfg.gamma, draft_ks)
    if seconds:
        log.info("forward.path=%s: compiled in %s", f.label, {k: round(v, 1) for k, v in seconds.items()})
    return seconds


def run_job(cfg: Config, job_dir: Path, resolved_yaml: str | None = None) -> bool:
    """Run one job into `job_dir`; returns False when it is skipped: already done (with the same config,
    else JobConflict), or claimed by a live worker. A folder specbench did not make raises ForeignDirError."""
    resolved_yaml = resolved_yaml or OmegaConf.to_yaml(OmegaConf.structured(cfg))
    runstore.check_job_dir(job_dir)
    if runstore.is_done(job_dir) and not cfg.force:
        return _skip_done(job_dir, resolved_yaml)
    claim = claims.try_claim(job_dir)
    if not isinstance(claim, claims.Claim):
        log.warning("skip %s: claimed by %s (a live worker runs it)", job_dir, claims.describe(claim))
        return False
    with claim:
        if not runstore.prepare_job_dir(job_dir, force=cfg.force):  # finished by another worker meanwhile
            return _skip_done(job_dir, resolved_yaml)
        log.info("run %s: claimed by %s", job_dir, claims.describe(claim.record))
        try:
            _run(cfg, job_dir, resolved_yaml, claim.record)
        except Exception as exc:  # recorded, then the sweep goes on with the next job
            runstore.write_failure(job_dir, exc)
            log.error("job %s failed (%s): %s", job_dir, "oom" if runstore.is_oom(exc) else "error", exc)
            raise
    return True


def _skip_done(job_dir: Path, resolved_yaml: str) -> bool:
    """A done job is skipped only when it ran this very config."""
    stored = job_dir / "config.yaml"
    diff = config_diff(stored.read_text(encoding="utf-8"), resolved_yaml) if stored.is_file() else []
    if diff:
        raise JobConflict(
            f"{job_dir} is done with another config than this job's ({'; '.join(diff[:4])}; see {stored}): "
            "re-run it with force=true, or give this one another sweep_name"
        )
    log.info("skip %s: already done", job_dir)
    return False


def _run(cfg: Config, job_dir: Path, resolved_yaml: str, claim: dict) -> None:
    runstore.write_text(job_dir, "config.yaml", resolved_yaml)
    runstore.write_json(job_dir, "env", environment_record())
    texts = check_workload(cfg)  # before the models load: a bad workload fails in milliseconds
    names = decoders(cfg)
    for name in names:  # e.g. llama.cpp's binaries, named with their build command
        ENGINES.get(name).preflight(cfg)
    pair = load_pair(cfg.pair, cfg.draft)
    prompts = encode_workload(cfg, pair, texts)
    compile_seconds = set_forward_path(cfg, pair, prompts)
    keys = job_keys(cfg, pair)
    batches = batches_of(prompts, cfg.batch_size)

    rounds, requests = [], []
    telemetry = JobTelemetry(str(pair.target.device))
    steps = [(r, i) for r in range(cfg.repeats) for i in range(len(batches))]
    with open_engines(cfg, pair, names) as sessions, PeakMemory(pair.target.device) as peak:
        warm_up(cfg, pair, names, batches, sessions)
        for repeat, i in tqdm(steps, desc=f"{job_dir.name or 'job'}", unit="batch", leave=False):
            rd, qd = measure_batch(cfg, pair, keys, names, i, batches[i], repeat, telemetry, sessions)
            rounds.append(rd)
            requests.append(qd)
    new_shapes = pair.forward.new_shapes(pair.target, pair.draft_model)  # before C_t(k) meets its own ks
    runstore.write_table(job_dir, "rounds", pd.concat(rounds, ignore_index=True))
    runstore.write_table(job_dir, "requests", pd.concat(requests, ignore_index=True).assign(**peak.record))
    if cfg.ct_bench:  # each engine family's costs once (torch: C_t(k) and the floor; llama.cpp: llama-bench)
        for costs in dict.fromkeys(ENGINES.get(n).costs for n in names if ENGINES.get(n).costs):
            for table, rows in costs(cfg, pair, keys, prompts, CT_KS).items():
                runstore.write_table(job_dir, table, rows)
    meta = telemetry.write(job_dir)
    runstore.mark_done(
        job_dir,
        {
            **keys,
            "machine": {"key": machine_key(cfg.pair.device, cfg.forward.path, cfg.pair.dtype)}
            | machine_record(cfg.pair.device, cfg.forward.path, cfg.pair.dtype),
            "claim": claim,
            "prompts": len(prompts),
            "engines": names,
            # threads the job ran with: torch's in this process, llama.cpp's servers' (-t) when it ran them
            "threads": {"torch": torch.get_num_threads(), "setting": cfg.threads}
            | ({"llama_cpp": llama_threads(cfg)} if any(runs_in(n, SERVER) for n in names) else {}),
            "batches": len(batches),
            "repeats": cfg.repeats,
            "telemetry": meta,
            "memory": peak.record,
            **auto_dtype_record(cfg),
            **auto_choices_record(cfg),
            "draft_kernel_rows": kernel_choices(pair.draft_model) if pair.draft_model is not None else {},
            "draft_kernel_sources": kernel_sources(pair.draft_model) if pair.draft_model is not None else {},
            # draft=auto's choice on this device: the kinds it skipped, with the reason (no kernel there)
            "draft_refused": {
                k: r for k in DRAFT_KINDS.names() if (r := device_refusal(k, cfg.pair.device, cfg.pair.dtype))
            },
            "cpu_linear": {  # bf16 linears on CPU: per shape, the rows up to which ATen's gemv runs (pair.cpu_linear)
                "setting": cfg.pair.cpu_linear,
                "target_gemv_rows": linear_kernels(pair.target),
                "draft_gemv_rows": linear_kernels(pair.draft_model) if pair.draft_model is not None else {},
            },
            "forward": {
                "path": cfg.forward.label,
                "reason": pair.forward.reason,  # forward.path=auto: why this path (eager: what the fast path lacked)
                "capacity": pair.forward.capacity,
                "compile_seconds": compile_seconds,  # before warm-up; never inside a timed phase
                "draft_decode_kv": takes_decode_kv(pair),  # the draft took the target's K/V every round
                "new_shapes_while_measured": new_shapes,
            },
        },
    )

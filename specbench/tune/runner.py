"""Tuning runs: trials measured through the benchmark protocol (`specbench.bench.protocol`),
the same warm-up, seeds, decoder order, row labels and telemetry as a sweep job, then
reported to Optuna per prompt batch (paired speedups) so the paired pruner can act.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pandas as pd
from optuna.trial import TrialState

from specbench.bench import runstore
from specbench.bench.job import check_workload, encode_workload
from specbench.bench.protocol import bench_ct, decoders, job_keys, measure_batch, warm_up
from specbench.bench.telemetry import JobTelemetry
from specbench.bench.workloads import EncodedPrompt
from specbench.config import Config
from specbench.decoding.forward import DECODE_KV_DRAFT_KS, DRAFT_KS, ForwardPath, capacity_for
from specbench.decoding.forward_choice import ForwardChoice, choose_for
from specbench.models.draft_kinds import takes_decode_kv
from specbench.models.pair import Pair, load_pair
from specbench.tune.objectives import OBJECTIVES
from specbench.tune.paired import batch_speedups, compact, objective_value
from specbench.tune.profile import model_choice
from specbench.tune.recommend import decode_seconds, format_table, recommendation_table, write_recommendations
from specbench.tune.samplers import SAMPLERS, TAU_STEP, TAUS, SearchSpace, config_of, policy_choices, reads_tau
from specbench.tune.study import (
    PairedPruner,
    StudySpec,
    fail_stale,
    finished,
    open_storage,
    open_study,
    plan_studies,
    slug,
    storage_url,
    worker_id,
)

log = logging.getLogger("specbench.tune")


@dataclass
class Measurement:
    """Rows of one trial (or profile run) as they accumulate, with its telemetry and decode time."""

    telemetry: JobTelemetry
    rounds: list[pd.DataFrame] = field(default_factory=list)
    requests: list[pd.DataFrame] = field(default_factory=list)
    decode_s: float = 0.0  # Σ batch walls of every measured decode call

    def rounds_frame(self) -> pd.DataFrame:
        return pd.concat(self.rounds, ignore_index=True)

    def requests_frame(self, job: str | None = None) -> pd.DataFrame:
        """Request rows; with `job`, a `job` column (what `analysis.speedup` pairs within)."""
        df = pd.concat(self.requests, ignore_index=True)
        return df.assign(job=job) if job is not None else df


class Runner:
    """Loads models once per draft kind, warms up once per draft, measures batches through the
    protocol and records raw rows under `<out_dir>/trials/<study>/<name>/` (the run-store layout)."""

    def __init__(self, cfg: Config, out_dir: Path) -> None:
        self.cfg, self.out_dir = cfg, Path(out_dir)
        self.pairs: dict[str, Pair] = {}
        self.warm: set[str] = set()
        self.warmup_s = 0.0
        self.compiled: set[tuple] = set()  # (draft, batch size, capacity) whose fast-path shapes are compiled
        self.compile_s = 0.0  # fast path: compilation before any measurement (never inside a timed phase)
        self.choice: ForwardChoice | None = None  # forward.path resolved on the first pair (auto: what runs here)

    def job_cfg(
        self, draft: str, gamma: int, batch_size: int, max_new_tokens: int | None = None, policy: dict | None = None
    ) -> Config:
        """The job config of one measurement: the run's config at this (draft, γ, batch size) and draft-length
        `policy` ({"policy": name, "tau": tau}; None: the run's)."""
        c = self.cfg
        return dataclasses.replace(
            c,
            draft=dataclasses.replace(c.draft, kind=draft, **(policy or {})),
            gamma=int(gamma),
            batch_size=int(batch_size),
            max_new_tokens=max_new_tokens or c.max_new_tokens,
        )

    def pair(self, draft: str) -> Pair:
        """The pair of this draft kind; the first one resolves forward.path (`self.cfg` then names what runs)."""
        if draft not in self.pairs:
            pair = load_pair(self.cfg.pair, dataclasses.replace(self.cfg.draft, kind=draft))
            f = self.cfg.forward
            if self.choice is None:
                self.choice = choose_for(f.path, f.compile_mode, self.cfg.pair.device, *pair.configs())
                f = dataclasses.replace(f, path=self.choice.path, compile_mode=self.choice.compile_mode)
                self.cfg = dataclasses.replace(self.cfg, forward=f)
                log.info("forward.path=%s (%s)", f.label, self.choice.reason or "as configured")
            pair.forward = ForwardPath.chosen(self.choice, f.capacity)
            self.pairs[draft] = pair
        return self.pairs[draft]

    def compile_shapes(self, draft: str, batches: list[list[EncodedPrompt]]) -> None:
        """Fast path: size the cache for these batches at any γ up to gamma_max and compile every shape
        a trial or C_t(k) meets (target k = 1..gamma_max + 1), before anything is timed."""
        pair, t = self.pair(draft), self.cfg.tune
        if not pair.forward.fast or not batches:
            return
        tokens = max(self.cfg.max_new_tokens, t.profile_max_new_tokens or 0)
        lengths = [len(p.ids) for b in batches for p in b]
        capacity = self.cfg.forward.capacity or capacity_for(lengths, tokens, t.gamma_max)
        key = (draft, len(batches[0]), capacity)
        if key in self.compiled:
            return
        self.compiled.add(key)
        pair.forward = ForwardPath.chosen(self.choice, capacity)
        draft_ks = DECODE_KV_DRAFT_KS if takes_decode_kv(pair) else DRAFT_KS
        target = pair.forward.warm_up(pair.target, len(batches[0]), list(range(1, t.gamma_max + 2)))
        drafted = pair.forward.warm_up(pair.draft_model, len(batches[0]), list(draft_ks))
        self.compile_s += target + drafted
        log.info(
            "forward.path=%s: compiled in %.1f s (target %.1f s)", self.cfg.forward.label, target + drafted, target
        )

    def warmup(self, draft: str, batches: list[list[EncodedPrompt]]) -> None:
        """The protocol's warm-up, once per draft (never recorded; its time is reported)."""
        self.compile_shapes(draft, batches)
        if draft in self.warm or not batches:
            return
        self.warm.add(draft)
        c = self.job_cfg(draft, self.cfg.tune.profile_gamma, len(batches[0]))
        self.warmup_s += warm_up(c, self.pair(draft), decoders(c, baseline=True), batches)

    def new_measurement(self) -> Measurement:
        """An empty measurement with its own telemetry (NVML on CUDA, a no-op elsewhere)."""
        return Measurement(JobTelemetry(self.cfg.pair.device))

    def measure(
        self,
        m: Measurement,
        draft: str,
        gamma: int,
        spec: StudySpec,
        index: int,
        batch: list[EncodedPrompt],
        repeat: int,
        max_new_tokens: int | None = None,
        policy: dict | None = None,
    ) -> None:
        """One protocol batch (AR and speculative, same seed, alternating order) into `m`."""
        c = self.job_cfg(draft, gamma, spec.batch_size, max_new_tokens, policy)
        pair = self.pair(draft)
        rd, qd = measure_batch(
            c, pair, job_keys(c, pair), decoders(c, baseline=True), index, batch, repeat, m.telemetry
        )
        m.rounds.append(rd)
        m.requests.append(qd)
        m.decode_s += float(qd.groupby("decoder")["wall_time"].max().sum())

    def bench_ct(self, draft: str, spec: StudySpec, ks: range) -> pd.DataFrame:
        """C_t(k) at the study's batch size and mean prompt length, labelled like a job's."""
        c, pair = self.job_cfg(draft, 1, spec.batch_size), self.pair(draft)
        if pair.forward.mode is None:
            return bench_ct(c, pair, job_keys(c, pair), spec.prompts, ks)
        # compiled: the protocol times one γ's shapes (k = 1, γ + 1); compile_shapes compiled every k here
        frames = [bench_ct(dataclasses.replace(c, gamma=k - 1), pair, job_keys(c, pair), spec.prompts, ks) for k in ks]
        return pd.concat([f[f["k"] == k] for f, k in zip(frames, ks)], ignore_index=True)

    def study_dir(self, spec: StudySpec) -> Path:
        return self.out_dir / "trials" / slug(spec.name)

    def record(self, spec: StudySpec, name: str, m: Measurement, meta: dict) -> None:
        """rounds, requests and telemetry of a measurement, then done.json (`meta` + telemetry)."""
        if not m.rounds:
            return
        job_dir = self.study_dir(spec) / name
        runstore.prepare_job_dir(job_dir, force=True)
        runstore.write_table(job_dir, "rounds", m.rounds_frame())
        runstore.write_table(job_dir, "requests", m.requests_frame())
        runstore.mark_done(job_dir, {**meta, "decode_s": m.decode_s, "telemetry": m.telemetry.write(job_dir)})

    def record_ct(self, spec: StudySpec, name: str, ct: pd.DataFrame) -> None:
        job_dir = self.study_dir(spec) / name
        runstore.prepare_job_dir(job_dir, force=True)
        runstore.write_table(job_dir, "ct", ct)
        runstore.mark_done(job_dir, {"study": spec.name, "kind": "ct"})


def suggest_policy(trial, policies: list[str] | None) -> dict | None:
    """The trial's draft-length policy and tau (None: the run's own): tau only for a policy that reads it;
    `fixed` is always among the choices (`samplers.policy_choices`), the yardstick of the others."""
    choices = policy_choices(policies)
    if not choices:
        return None
    name = trial.suggest_categorical("policy", choices)
    tau = trial.suggest_float("tau", TAUS[0], TAUS[-1], step=TAU_STEP) if reads_tau(name) else 0.0
    return {"policy": name, "tau": tau}


def run_trial(cfg: Config, spec: StudySpec, study, trial, runner: Runner, m: Measurement) -> float:
    """Measure one trial batch by batch into `m`; report per-batch paired speedups; raise
    TrialPruned when the paired pruner says it is worse than the best by more than the margin."""
    objective = cfg.tune.objective
    reference = study.user_attrs.get("reference") or {}
    draft = trial.suggest_categorical("draft", spec.drafts)
    gamma = trial.suggest_int("gamma", 1, cfg.tune.gamma_max)
    policy = suggest_policy(trial, cfg.tune.policies)
    trial.set_user_attr("worker", worker_id())
    runner.warmup(draft, spec.batches)
    job = f"trial-{trial.number:04d}"
    for i, batch in enumerate(spec.batches):
        for rep in range(cfg.repeats):
            runner.measure(m, draft, gamma, spec, i, batch, rep, policy=policy)
        requests = m.requests_frame(job)
        trial.set_user_attr("requests", compact(requests))
        trial.set_user_attr("decode_s", m.decode_s)
        trial.report(float(batch_speedups(requests[requests["batch"] == i], objective).get(i, math.nan)), step=i)
        if i + 1 < len(spec.batches) and trial.should_prune():
            raise optuna.TrialPruned(
                f"batch {i}: worse than the best trial by more than "
                f"{cfg.tune.prune_margin:.0%} on the same batches (paired test)"
            )
    return objective_value(m.requests_frame(job), objective, reference)


def tune_study(cfg: Config, spec: StudySpec, storage, runner: Runner) -> dict:
    """Run trials of one study until it has `n_trials` finished trials (or the local search converged)."""
    t = cfg.tune
    seed = cfg.seed * 7919 + os.getpid()  # distinct streams for distinct workers
    sampler = SAMPLERS.get(t.sampler, "tune.sampler")(
        SearchSpace(spec.drafts, t.gamma_max, policy_choices(t.policies)), seed
    )
    pruner = PairedPruner(t.prune_margin, t.prune_alpha, t.prune_after, len(spec.batches), t.prune)
    profile: dict = {"seconds": 0.0}

    def create() -> dict:
        model, reference = model_choice(cfg, spec, runner)
        profile["seconds"] = model["decode_s"]
        return {
            "model": model,
            "reference": reference,
            "objective": t.objective,
            "units": OBJECTIVES.get(t.objective).unit,
        }

    study = open_study(cfg, spec, storage, sampler, pruner, create)
    fail_stale(study)
    mine, fails, stop = [], 0, "n_trials"
    while finished(study) < t.n_trials:
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if t.sampler == "local" and t.stop_when_converged and not waiting and sampler.propose(study) is None:
            stop = "converged"
            break
        trial = study.ask()
        m = runner.new_measurement()
        meta = {"study": spec.name, "trial": trial.number}
        try:
            value = run_trial(cfg, spec, study, trial, runner, m)
        except optuna.TrialPruned as exc:
            ft = study.tell(trial, state=TrialState.PRUNED)
            runner.record(spec, f"trial-{trial.number:04d}", m, {**meta, "state": "pruned", "params": ft.params})
            _log_trial(spec, ft, "pruned", str(exc))
            mine.append(trial.number)
            continue
        except Exception as exc:  # recorded as FAIL; a repeated failure stops the study
            study.tell(trial, state=TrialState.FAIL)
            log.error("trial %d failed: %s: %s", trial.number, type(exc).__name__, exc)
            fails += 1
            if fails >= 3:
                raise
            continue
        ft = study.tell(trial, value)
        runner.record(
            spec, f"trial-{trial.number:04d}", m, {**meta, "state": "complete", "value": value, "params": ft.params}
        )
        _log_trial(spec, ft, "complete", "")
        mine.append(trial.number)
    return {
        "study": spec.name,
        "trials_run": mine,
        "stopped": stop,
        "finished": finished(study),
        "profile_s": profile["seconds"],
    }


def _log_trial(spec: StudySpec, ft, state: str, note: str) -> None:
    p, iv = ft.params, ft.intermediate_values
    s = float(pd.Series(iv, dtype=float).median()) if iv else math.nan
    log.info(
        "%s | trial %d %s: %s value=%s median batch speedup=%.2f× over %d batches, %.1f s %s",
        spec.categories,
        ft.number,
        state,
        arm.label() if (arm := config_of(ft)) is not None else p,
        f"{ft.value:.4g}" if ft.value is not None else "-",
        s,
        len(iv),
        ft.user_attrs.get("decode_s", 0.0),
        note,
    )


def run_tune(cfg: Config, out_dir: Path) -> pd.DataFrame:
    """`python -m specbench +tune=gamma`: tune every study of this config; write and print the table."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("specbench").setLevel(logging.INFO)
    t = cfg.tune
    out_dir = Path(out_dir)
    url = storage_url(t.storage, cfg.runs_dir)
    storage = open_storage(url)
    texts = check_workload(cfg)  # before any model loads
    runner = Runner(cfg, out_dir)
    first = runner.pair(t.draft_kinds(cfg)[0])
    cfg = runner.cfg  # forward.path resolved: study names and rows say what runs
    specs = plan_studies(cfg, encode_workload(cfg, first, texts))
    unit = OBJECTIVES.get(t.objective).unit
    results = []
    for spec in specs:
        log.info(
            "study %s: %d prompts in %d batches, search draft∈%s γ∈[1,%d], objective %s (%s)",
            spec.name,
            len(spec.prompts),
            len(spec.batches),
            spec.drafts,
            t.gamma_max,
            t.objective,
            unit,
        )
        results.append(tune_study(cfg, spec, storage, runner))
    studies = [optuna.load_study(study_name=s.name, storage=storage) for s in specs]
    for r, s in zip(results, studies):
        r["decode_s"] = decode_seconds(s)
    table = recommendation_table(studies, t.confidence)
    write_recommendations(table, out_dir)
    worker = slug(worker_id().replace(":", "-"))
    runstore.write_json(
        out_dir,
        f"tune_run-{worker}",
        {
            "worker": worker_id(),
            "storage": url,
            "studies": results,
            "warmup_s": runner.warmup_s,
            "forward": {"path": cfg.forward.label, "reason": runner.choice.reason, "compile_seconds": runner.compile_s},
        },
    )
    print(f"\nTuning ({t.objective}, {unit}), storage {url}:")
    print(format_table(table))
    for r in results:
        print(
            f"  {r['study']}: {len(r['trials_run'])} trials run here, {r['finished']} finished in the study "
            f"(stopped: {r['stopped']}); measurement time {r['decode_s']:.1f} s (+{runner.warmup_s:.1f} s warm-up)"
        )
    print(f"written: {out_dir}/recommendations.{{csv,json,md}}; browse: optuna-dashboard {url}")
    return table

"""Choose γ (and the draft) per workload, batch size and sampling config with Optuna.

`python -m specbench +tune=gamma` runs one Optuna study per (workload [category], batch
size, sampling config) with the ask/tell API. Every trial is a *real* measurement:
the speculative decoder at the trial's (draft, γ) and the autoregressive baseline decode
the same prompt batches with the same seeds, interleaved batch by batch (the job
protocol of `specbench.bench.job`), so drift on a shared machine hits both alike.

Objective (``tune.objective``), computed per prompt batch b from the paired runs:

* ``throughput`` (default, maximise): R × s_b, with s_b the paired speedup of batch b
  (spec tokens/s ÷ AR tokens/s of the same batch and seed, measured back to back) and
  R the study's *reference* AR tokens/s (measured once, when the study is created, and
  frozen in the study so values stay comparable across trials, runs and workers). The
  trial value is the median over batches (each batch: median over `repeats`).
* ``speedup`` (maximise): s_b itself (no reference needed).
* ``latency_mean`` / ``latency_p95`` (minimise): per request, spec seconds per token ÷
  the paired AR seconds per token, × the reference AR seconds per token; mean or 95th
  percentile over requests.

Search: γ ∈ [1, tune.gamma_max] and, when ``tune.drafts`` lists several kinds, the draft.
The cost model's optimal (draft, γ) is enqueued as trial 0: `specbench.costmodel`'s
acceptance and timing profiles and speedup model, fitted on a profile run (one batch at
``tune.profile_gamma`` with its paired baseline, plus a C_t(k) micro-benchmark for
k = 1..gamma_max+1) or on a prior sweep (``tune.prior_sweep=runs/<sweep>``). The default
sampler ``local`` climbs from there (neighbours γ±1 and the other drafts at the same γ,
ordered by the model's predicted speedup) and stops when every neighbour of the best
trial has been measured; ``tpe``, ``random`` and ``grid`` (brute force) are Optuna's own.
Per-batch values are reported as intermediate values; after ``tune.prune_after`` batches
a trial whose median ratio to the best complete trial *on the same batches* is worse
than 1 - ``tune.prune_margin`` is pruned (a racing rule: a configuration that does not
keep up with the incumbent on the first prompts is dropped; gentler than a MedianPruner).
Raw per-batch measurements (token counts, wall times of both decoders) are stored as the
trial's user attribute ``batches``; the recommendation is recomputed from those, and
alternatives whose per-batch values do not differ from the chosen one's (Mann-Whitney
p ≥ 1 - ``tune.confidence``) are reported as indistinguishable ("γ=5 ≈ γ=4 (p=0.69)").

Storage: ``sqlite:///<runs_dir>/tune/optuna.db`` by default; any RDB URL, or
``journal:<path>`` (also a bare path ending in .journal/.log) for Optuna's journal file
storage. Studies are shared: several workers (processes, machines on a shared disk or
database) may run the same command; ``tune.n_trials`` counts *finished* (complete or
pruned) trials of the study, so a re-run resumes and only runs the remainder (workers
racing for the last trials may overshoot by one each). Exactly one worker creates a study
(``create_study(load_if_exists=False)``; the others get DuplicatedStudyError and load it),
enqueues trial 0 and marks the study ready; the others wait for that mark.
Browse with ``optuna-dashboard sqlite:///runs/tune/optuna.db``.

Output (the Hydra job dir, ``runs/tune/<overrides>/``): recommendations.{csv,json,md},
one ``tune_run-<worker>.json`` per worker, and the raw rows of every trial this worker
ran under ``trials/<study>/trial-NNNN/`` (the run-store layout). ``python -m
specbench.tune <storage> [--out DIR]`` rebuilds the table of every study in a storage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger("specbench.tune")

# objective -> optimisation direction
OBJECTIVES = {"throughput": "maximize", "speedup": "maximize", "latency_mean": "minimize", "latency_p95": "minimize"}
OBJECTIVE_UNITS = {"throughput": "tokens/s", "speedup": "x", "latency_mean": "s/token", "latency_p95": "s/token"}
SAMPLERS = ("local", "tpe", "random", "grid")
STUDY_MARK = "specbench_tune"  # study user attribute that marks a specbench tuning study
REC_COLUMNS = [
    "workload", "categories", "batch_size", "sampling", "draft", "gamma", "speedup", "speedup_lo", "speedup_hi",
    "verdict", "tok_s", "ar_tok_s", "objective", "objective_value", "n_trials", "n_complete", "n_pruned",
    "n_batches", "model_gamma", "model_speedup", "indistinguishable", "decode_s", "study",
]  # fmt: skip


# --------------------------------------------------------------------------- config


def _bad(name: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"{name}={value!r}: {allowed}")


@dataclass
class TuneConfig:
    """`+tune=gamma`: choose γ (and the draft) with Optuna from real paired runs.

    The measurement protocol is the job's: `max_new_tokens`, `repeats`, `warmup`, `seed`,
    `batch_size` (unless `batch_sizes`), `sampling` and the workload come from the job config.
    """

    enabled: bool = False
    objective: str = "throughput"  # throughput | speedup | latency_mean | latency_p95
    gamma_max: int = 8  # γ is searched in [1, gamma_max]
    drafts: Optional[list[str]] = None  # draft kinds searched; None: the job's draft.kind
    n_trials: int = 8  # finished (complete + pruned) trials per study, earlier runs included
    sampler: str = "local"  # local | tpe | random | grid
    stop_when_converged: bool = True  # local: stop when every neighbour of the best was measured
    prune: bool = True
    prune_after: int = 2  # prompt batches measured before a trial may be pruned
    prune_margin: float = 0.03  # prune when ≥ this much worse than the best, on the same batches
    batch_sizes: Optional[list[int]] = None  # one study per batch size; None: [batch_size]
    split_categories: bool = False  # one study per workload category (else one for the whole workload)
    max_prompts: Optional[int] = None  # a seeded sample of the workload per study; None: all prompts
    storage: Optional[str] = None  # None: sqlite:///<runs_dir>/tune/optuna.db; an RDB URL; journal:<path>
    study_name: Optional[str] = None  # None: derived from pair, workload, sampling, batch size, objective
    prior_sweep: Optional[str] = None  # runs/<sweep> to fit the cost model on, instead of a profile run
    profile_gamma: int = 4  # γ of the short profile run that the cost model is fitted on
    profile_batches: int = 1
    profile_max_new_tokens: Optional[int] = None  # tokens of the profile run (capped at max_new_tokens); None: max_new_tokens
    profile_ct: bool = True  # also time target forwards over k = 1..gamma_max+1 tokens (C_t(k))
    confidence: float = 0.95  # CI level; γ whose test p ≥ 1 - confidence are "indistinguishable"

    def __post_init__(self) -> None:
        from specbench.models.draft_kinds import DRAFT_KINDS

        if self.objective not in OBJECTIVES:
            raise _bad("tune.objective", self.objective, f"must be one of {list(OBJECTIVES)}")
        if self.sampler not in SAMPLERS:
            raise _bad("tune.sampler", self.sampler, f"must be one of {list(SAMPLERS)}")
        for name in ("gamma_max", "n_trials", "prune_after", "profile_gamma", "profile_batches"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise _bad(f"tune.{name}", v, "must be an integer >= 1")
        for name in ("max_prompts", "profile_max_new_tokens"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise _bad(f"tune.{name}", v, "must be null or an integer >= 1")
        if self.drafts is not None:
            drafts = list(self.drafts)
            if not drafts:
                raise _bad("tune.drafts", drafts, f"must list at least one draft kind of {list(DRAFT_KINDS)} "
                                                  "(or be null for the job's draft.kind)")  # fmt: skip
            for d in drafts:
                if d not in DRAFT_KINDS:
                    raise _bad("tune.drafts", drafts, f"unknown draft kind {d!r}; allowed: {list(DRAFT_KINDS)}")
            if len(set(drafts)) != len(drafts):
                raise _bad("tune.drafts", drafts, "lists a draft kind twice")
        if self.batch_sizes is not None:
            bs = list(self.batch_sizes)
            if not bs or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in bs):
                raise _bad("tune.batch_sizes", bs, "must be null or a non-empty list of integers >= 1")
        if not (0.0 <= float(self.prune_margin) < 1.0):
            raise _bad("tune.prune_margin", self.prune_margin, "must be in [0, 1)")
        if not (0.0 < float(self.confidence) < 1.0):
            raise _bad("tune.confidence", self.confidence, "must be in (0, 1)")
        if self.storage is not None and not str(self.storage).strip():
            raise _bad("tune.storage", self.storage, "must be null, an RDB URL (sqlite:///path.db) or journal:<path>")

    def check(self, cfg: Any) -> None:
        """Checks that need the job config (called from `Config.__post_init__`, before any model loads)."""
        for d in self.draft_kinds(cfg):
            if d == "model" and not (cfg.pair.draft.source or cfg.pair.draft.shape):
                raise _bad("tune.drafts", self.draft_kinds(cfg),
                           f"'model' needs pair.draft (pair {cfg.pair.name!r} has none); "
                           "allowed for this pair: ['w8a16', 'ngram']")  # fmt: skip
        if cfg.decoder == "hf_assisted" and any(b != 1 for b in self.batch_size_list(cfg)):
            raise _bad("tune.batch_sizes", self.batch_size_list(cfg), "decoder='hf_assisted' supports batch size 1 only")

    def draft_kinds(self, cfg: Any) -> list[str]:
        return list(self.drafts) if self.drafts is not None else [cfg.draft.kind]

    def batch_size_list(self, cfg: Any) -> list[int]:
        return list(self.batch_sizes) if self.batch_sizes is not None else [cfg.batch_size]


# --------------------------------------------------------------------------- storage


def storage_url(spec: str | None, runs_dir: str | os.PathLike = "runs") -> str:
    """The storage spec with the default filled in: sqlite:///<runs_dir>/tune/optuna.db."""
    if spec:
        return str(spec)
    return f"sqlite:///{Path(runs_dir) / 'tune' / 'optuna.db'}"


def open_storage(spec: str):
    """An Optuna storage: an RDB URL (sqlite://, postgresql://, mysql://...) or a journal file
    (`journal:<path>`, or a path ending in .journal/.log) for workers on a shared disk."""
    import optuna
    from optuna.storages import JournalStorage, RDBStorage
    from optuna.storages.journal import JournalFileBackend

    journal = spec[len("journal:"):] if spec.startswith("journal:") else None
    if journal is None and "://" not in spec and spec.endswith((".journal", ".log")):
        journal = spec
    if journal is not None:
        journal = journal.removeprefix("//")  # journal:///abs/path or journal:relative/path
        Path(journal).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(journal))
    if "://" not in spec:
        raise _bad("tune.storage", spec, "must be an RDB URL such as sqlite:///runs/tune/optuna.db, "
                                         "or journal:<path> for a journal file")  # fmt: skip
    kwargs: dict = {}
    if spec.startswith("sqlite:///"):
        path = spec[len("sqlite:///"):]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 120}}  # several workers on one file
    return RDBStorage(spec, **kwargs)


# --------------------------------------------------------------------------- objective (pure)


def _finite(xs) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(float(x))]


def _median(xs) -> float:
    import numpy as np

    xs = _finite(xs)
    return float(np.median(xs)) if xs else math.nan


def record_metrics(rec: dict) -> dict:
    """Derived quantities of one raw paired record (one batch, one repeat).

    speedup = (Σ spec tokens / spec batch wall) / (Σ AR tokens / AR batch wall); the
    batch wall is the slowest row's. latency_ratio: per row, spec s/token ÷ AR s/token.
    """
    sp, ar = rec["spec"], rec["ar"]
    sw, aw = max(sp["wall_time"]), max(ar["wall_time"])
    s_tok, a_tok = sum(sp["new_tokens"]), sum(ar["new_tokens"])
    spec_tok_s = s_tok / sw if sw > 0 else math.nan
    ar_tok_s = a_tok / aw if aw > 0 else math.nan
    ratios = []
    for sn, swt, an, awt in zip(sp["new_tokens"], sp["wall_time"], ar["new_tokens"], ar["wall_time"]):
        if sn > 0 and an > 0 and awt > 0:
            ratios.append((swt / sn) / (awt / an))
    return {"speedup": spec_tok_s / ar_tok_s if ar_tok_s > 0 else math.nan, "spec_tok_s": spec_tok_s,
            "ar_tok_s": ar_tok_s, "spec_tokens": s_tok, "ar_tokens": a_tok, "spec_wall": sw, "ar_wall": aw,
            "latency_ratio": ratios, "seconds": sw + aw}  # fmt: skip


def _scale(objective: str, reference: dict) -> float:
    key = {"throughput": "ar_tok_s", "latency_mean": "ar_latency", "latency_p95": "ar_latency"}.get(objective)
    if key is None:
        return 1.0
    v = reference.get(key)
    return float(v) if v is not None and math.isfinite(float(v)) and v > 0 else 1.0


def objective_value(records: list[dict], objective: str, reference: dict) -> float:
    """The objective over a set of raw records (one batch's repeats, or a whole trial)."""
    import numpy as np

    if not records:
        return math.nan
    m = [record_metrics(r) for r in records]
    scale = _scale(objective, reference)
    if objective in ("throughput", "speedup"):
        by_batch: dict[int, list[float]] = {}
        for r, mm in zip(records, m):
            by_batch.setdefault(int(r["batch"]), []).append(mm["speedup"])
        return scale * _median([_median(v) for v in by_batch.values()])
    ratios = _finite(x for mm in m for x in mm["latency_ratio"])
    if not ratios:
        return math.nan
    if objective == "latency_mean":
        return scale * float(np.mean(ratios))
    return scale * float(np.percentile(ratios, 95))


def batch_values(records: list[dict], objective: str, reference: dict) -> dict[int, float]:
    """Per prompt batch: the objective over that batch's repeats (the intermediate values)."""
    by_batch: dict[int, list[dict]] = {}
    for r in records:
        by_batch.setdefault(int(r["batch"]), []).append(r)
    return {b: objective_value(rs, objective, reference) for b, rs in sorted(by_batch.items())}


def is_better(a: float, b: float, objective: str) -> bool:
    if not math.isfinite(a):
        return False
    if not math.isfinite(b):
        return True
    return a > b if OBJECTIVES[objective] == "maximize" else a < b


# --------------------------------------------------------------------------- sampler and pruner


def _config_of(trial) -> tuple[str, int] | None:
    p = trial.system_attrs.get("fixed_params") or trial.params
    if "gamma" not in p:
        return None
    return (str(p.get("draft")), int(p["gamma"]))


def _make_local_sampler(drafts: list[str], gamma_max: int, seed: int | None):
    import optuna
    from optuna.trial import TrialState

    class LocalSearchSampler(optuna.samplers.BaseSampler):
        """Hill climbing over (draft, γ) from the cost model's choice (enqueued as trial 0).

        Proposes the untried neighbour of the best complete trial (γ±1 with the same draft,
        the other drafts at the same γ), ordered by the cost model's predicted speedup (study
        attribute `model`), γ+1 first when there is none. `propose` returns None when every
        neighbour has been tried (converged); then an untried configuration is drawn at
        random, and when all are tried a random one.
        """

        def __init__(self) -> None:
            self._rng = random.Random(seed)
            self._cache: dict[int, dict] = {}

        def infer_relative_search_space(self, study, trial):
            return {}

        def sample_relative(self, study, trial, search_space):
            return {}

        def propose(self, study) -> dict | None:
            trials = study.get_trials(deepcopy=False)
            tried = {c for t in trials if (c := _config_of(t)) is not None}
            complete = [t for t in trials if t.state == TrialState.COMPLETE and _config_of(t) is not None]
            pred = (study.user_attrs.get("model") or {}).get("prediction") or {}

            def predicted(c):
                v = (pred.get(c[0]) or {}).get(str(c[1]))
                return v if v is not None else -math.inf

            if not complete:
                untried = [(d, g) for d in drafts for g in range(1, gamma_max + 1) if (d, g) not in tried]
                if not untried:
                    return None
                best = max(untried, key=lambda c: (predicted(c), -abs(c[1] - 4)))
                return {"draft": best[0], "gamma": best[1]}
            best_t = study.best_trial
            d0, g0 = _config_of(best_t)
            cands = [(d0, g0 + 1), (d0, g0 - 1)] + [(d, g0) for d in drafts if d != d0]
            cands = [c for c in cands if c[0] in drafts and 1 <= c[1] <= gamma_max and c not in tried]
            if not cands:
                return None
            order = {c: i for i, c in enumerate(cands)}
            c = max(cands, key=lambda c: (predicted(c), -order[c]))
            return {"draft": c[0], "gamma": c[1]}

        def sample_independent(self, study, trial, param_name, param_distribution):
            if trial.number not in self._cache:
                prop = self.propose(study)
                if prop is None:  # converged or exhausted: an untried configuration at random
                    tried = {c for t in study.get_trials(deepcopy=False) if (c := _config_of(t)) is not None}
                    untried = [(d, g) for d in drafts for g in range(1, gamma_max + 1) if (d, g) not in tried]
                    allc = untried or [(d, g) for d in drafts for g in range(1, gamma_max + 1)]
                    c = allc[self._rng.randrange(len(allc))]
                    prop = {"draft": c[0], "gamma": c[1]}
                self._cache[trial.number] = prop
            return self._cache[trial.number][param_name]  # proposals lie in the current search space

    return LocalSearchSampler()


def _make_pruner(margin: float, min_steps: int, direction: str, enabled: bool):
    import optuna
    from optuna.trial import TrialState

    class PairedMarginPruner(optuna.pruners.BasePruner):
        """Prune a trial that is clearly worse than the best complete trial *on the same prompt
        batches*: median over the common batches of (this batch value / best's batch value)
        below 1 - margin (maximise) or above 1 + margin (minimise), after `min_steps` batches."""

        def prune(self, study, trial) -> bool:
            if not enabled:
                return False
            iv = trial.intermediate_values
            if len(iv) < min_steps:
                return False
            if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
                return False
            ref = study.best_trial.intermediate_values
            ratios = [iv[s] / ref[s] for s in set(iv) & set(ref)
                      if math.isfinite(iv[s]) and math.isfinite(ref[s]) and ref[s] > 0]  # fmt: skip
            if len(ratios) < min_steps:
                return False
            med = _median(ratios)
            return med < 1.0 - margin if direction == "maximize" else med > 1.0 + margin

    return PairedMarginPruner()


def make_sampler(name: str, drafts: list[str], gamma_max: int, seed: int | None):
    import optuna

    if name == "local":
        return _make_local_sampler(drafts, gamma_max, seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=3)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.BruteForceSampler(seed=seed)


# --------------------------------------------------------------------------- studies


@dataclass
class StudySpec:
    """One study: a workload (or one of its categories), a batch size, the job's sampling."""

    name: str
    workload: str
    categories: str
    batch_size: int
    prompts: list  # EncodedPrompt
    drafts: list[str]

    @property
    def batches(self) -> list[list]:
        b = self.batch_size
        return [self.prompts[i : i + b] for i in range(0, len(self.prompts), b)]


def _slug(text: str, n: int = 100) -> str:
    """A directory name for a study: readable, filesystem-safe, unique (a hash of the full name)."""
    s = re.sub(r"[^A-Za-z0-9._=+-]+", "_", text).strip("_.")
    return f"{s[:n] or 'study'}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def default_study_name(cfg, categories: str, batch_size: int, drafts: list[str]) -> str:
    t = cfg.tune
    return (f"{cfg.pair.name}|{cfg.decoder}|drafts={'+'.join(drafts)}|{cfg.workload.name}[{categories}]"
            f"|b{batch_size}|{cfg.sampling.name}|{t.objective}|n{cfg.max_new_tokens}")  # fmt: skip


def plan_studies(cfg, prompts: list) -> list[StudySpec]:
    """Studies of a run: per category (tune.split_categories) × per batch size."""
    t = cfg.tune
    drafts = t.draft_kinds(cfg)
    groups: list[tuple[str, list]] = []
    if t.split_categories:
        cats = list(dict.fromkeys(p.category for p in prompts))
        groups = [(c, [p for p in prompts if p.category == c]) for c in cats]
    else:
        cats = cfg.workload.categories
        label = ",".join(cats) if cats else ",".join(dict.fromkeys(p.category for p in prompts)) or "all"
        groups = [(label if cats else "all", prompts)]
    specs = []
    for label, ps in groups:
        if t.max_prompts is not None and len(ps) > t.max_prompts:
            keep = sorted(random.Random(cfg.seed).sample(range(len(ps)), t.max_prompts))
            ps = [ps[i] for i in keep]
        for b in t.batch_size_list(cfg):
            name = default_study_name(cfg, label, b, drafts)
            if t.study_name:
                multi = len(groups) > 1 or len(t.batch_size_list(cfg)) > 1
                name = f"{t.study_name}|{label}|b{b}" if multi else t.study_name
            specs.append(StudySpec(name, cfg.workload.name, label, b, ps, drafts))
    return specs


def protocol(cfg, spec: StudySpec) -> dict:
    """What makes two runs' trial values comparable; stored in the study and checked on resume."""
    return {
        "pair": cfg.pair.name, "target": cfg.pair.target.shape or cfg.pair.target.source, "dtype": cfg.pair.dtype,
        "device": cfg.pair.device, "decoder": cfg.decoder, "workload": spec.workload, "categories": spec.categories,
        "batch_size": spec.batch_size, "sampling": dataclasses.asdict(cfg.sampling),
        "max_new_tokens": cfg.max_new_tokens, "repeats": cfg.repeats, "seed": cfg.seed,
        "objective": cfg.tune.objective, "drafts": spec.drafts,
        "batches": [[p.prompt_id for p in b] for b in spec.batches],
    }  # fmt: skip


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# --------------------------------------------------------------------------- measurement


class _Runner:
    """Loads models once per draft kind, warms up once, decodes paired batches, writes raw rows."""

    def __init__(self, cfg, out_dir: Path) -> None:
        self.cfg = cfg
        self.out_dir = out_dir
        self.pairs: dict[str, Any] = {}
        self.warm: set[str] = set()
        self.warmup_s = 0.0

    def job_cfg(self, draft: str, gamma: int, batch_size: int, max_new_tokens: int | None = None):
        cfg = self.cfg
        return dataclasses.replace(cfg, draft=dataclasses.replace(cfg.draft, kind=draft), gamma=int(gamma),
                                   batch_size=int(batch_size), max_new_tokens=max_new_tokens or cfg.max_new_tokens)

    def pair(self, draft: str):
        from specbench.models.pair import load_pair

        if draft not in self.pairs:
            self.pairs[draft] = load_pair(self.cfg.pair, dataclasses.replace(self.cfg.draft, kind=draft))
        return self.pairs[draft]

    def warmup(self, draft: str, batches: list[list]) -> None:
        """`warmup` batches, both decoders, 16 tokens: allocator, kernels; never recorded (but timed)."""
        from specbench.bench.job import decode_batch
        from specbench.decoding.records import AUTOREGRESSIVE, HF_ASSISTED, SPECULATIVE

        if draft in self.warm:
            return
        self.warm.add(draft)
        spec = HF_ASSISTED if self.cfg.decoder == HF_ASSISTED else SPECULATIVE
        c = self.job_cfg(draft, self.cfg.tune.profile_gamma, len(batches[0]) if batches else 1)
        for b in batches[: self.cfg.warmup]:
            for dec in (AUTOREGRESSIVE, spec):
                r = decode_batch(c, self.pair(draft), dec, [p.ids for p in b], self.cfg.seed, min(16, c.max_new_tokens))
                self.warmup_s += max((q.wall_time for q in r.requests), default=0.0)

    def measure(self, draft: str, gamma: int, batch_size: int, batch_index: int, batch: list, repeat: int,
                max_new_tokens: int | None = None):  # fmt: skip
        """One paired record: AR and speculative decoding of one batch, same seed, order alternating;
        plus its raw round and request rows (the `job` column comes from the run-store directory)."""
        import pandas as pd

        from specbench.bench.job import _label, decode_batch, job_keys
        from specbench.decoding.records import AUTOREGRESSIVE, HF_ASSISTED, REQUEST_COLUMNS, ROUND_COLUMNS, SPECULATIVE, to_frame

        c = self.job_cfg(draft, gamma, batch_size, max_new_tokens)
        pair = self.pair(draft)
        spec = HF_ASSISTED if c.decoder == HF_ASSISTED else SPECULATIVE
        seed = c.seed + 1_000_003 * repeat + batch_index  # the job's seeds: same batch, same seed
        order = [AUTOREGRESSIVE, spec] if (repeat + batch_index) % 2 == 0 else [spec, AUTOREGRESSIVE]
        keys = job_keys(c, pair)
        res, rounds, requests = {}, [], []
        for dec in order:
            r = decode_batch(c, pair, dec, [p.ids for p in batch], seed, c.max_new_tokens)
            res[dec] = r
            extra = {"decoder": dec, "repeat": repeat, "batch": batch_index, "gamma": gamma if dec != AUTOREGRESSIVE else 0}
            rounds.append(_label(to_frame(r.rounds, ROUND_COLUMNS), batch, keys, extra))
            requests.append(_label(to_frame(r.requests, REQUEST_COLUMNS), batch, keys, extra))

        def side(r):
            reqs = sorted(r.requests, key=lambda q: q.row)
            return {"new_tokens": [int(q.new_tokens) for q in reqs], "wall_time": [float(q.wall_time) for q in reqs],
                    "ttft": [float(q.ttft) for q in reqs]}  # fmt: skip

        sr = res[spec].rounds
        rec = {"batch": batch_index, "repeat": repeat, "prompt_ids": [p.prompt_id for p in batch], "first": order[0],
               "spec": side(res[spec]), "ar": side(res[AUTOREGRESSIVE]), "rounds": len({q.round for q in sr}),
               "drafted": int(sum(q.gamma for q in sr)), "accepted": int(sum(q.accepted for q in sr))}  # fmt: skip
        return rec, pd.concat(rounds, ignore_index=True), pd.concat(requests, ignore_index=True)


def _bench_ct(runner: "_Runner", draft: str, spec: "StudySpec", gamma_max: int):
    """C_t(k) for k = 1..gamma_max+1 at the study's batch size and mean prompt length
    (`specbench.bench.microbench`), labelled with the timing keys the cost model matches on."""
    import pandas as pd

    from specbench.bench.job import job_keys
    from specbench.bench.microbench import bench_target_forward

    pair = runner.pair(draft)
    context = int(sum(len(p.ids) for p in spec.prompts) / max(1, len(spec.prompts)))
    ct = pd.DataFrame(bench_target_forward(pair.target, spec.batch_size, range(1, gamma_max + 2), context,
                                           seed=runner.cfg.seed))  # fmt: skip
    keys = job_keys(runner.job_cfg(draft, 1, spec.batch_size), pair)
    for k in ("hardware", "dtype", "target", "pair"):
        ct[k] = keys[k]
    return ct


def _write_rows(job_dir: Path, rounds: list, requests: list, meta: dict) -> None:
    import pandas as pd

    from specbench.bench import runstore

    if not rounds:
        return
    runstore.prepare_job_dir(job_dir, force=True)
    runstore.write_table(job_dir, "rounds", pd.concat(rounds, ignore_index=True))
    runstore.write_table(job_dir, "requests", pd.concat(requests, ignore_index=True))
    runstore.mark_done(job_dir, meta)


# --------------------------------------------------------------------------- cost model


def _fit_prediction(rounds_df, gamma_max: int, ct=None) -> tuple[int, float, dict]:
    """(model-optimal γ, its predicted speedup, {γ: predicted speedup}) from round rows of one
    setting (speculative + AR rows) and optional C_t(k) rows, with `specbench.costmodel`'s
    acceptance and timing profiles and its speedup model."""
    from specbench import costmodel

    acc = costmodel.AcceptanceProfile.from_rounds(rounds_df)
    tim = costmodel.TimingProfile.from_rounds(rounds_df, ct, context=False)
    pred = costmodel.predict_speedup(acc, tim, range(1, gamma_max + 1))
    curve = {str(int(g)): (float(s) if math.isfinite(s) else None) for g, s in zip(pred["gamma"], pred["speedup"])}
    g, s = costmodel.optimal_gamma(acc, tim, gamma_max)
    return int(g), float(s), {"curve": curve, "alpha": float(acc.alpha), "ct1": float(tim.ct1),
                              "cd_per_token": float(tim.cd_per_token), "ct_k": tim.ct_k, "ct_t": tim.ct_t,
                              "ct_source": tim.ct_source}  # fmt: skip


def _prior_rows(cfg, spec: StudySpec, draft: str):
    """Rows of a prior sweep that match this study (draft kind, batch size, sampling, categories)."""
    import pandas as pd

    from specbench.bench import runstore
    from specbench.decoding.records import AUTOREGRESSIVE

    rounds = runstore.load_sweep(cfg.tune.prior_sweep, "rounds")
    requests = runstore.load_sweep(cfg.tune.prior_sweep, "requests")
    sel = {"batch_size": spec.batch_size, "sampling": cfg.sampling.name, "pair": cfg.pair.name}
    cats = {p.category for p in spec.prompts}

    def match(df, with_draft: bool):
        m = pd.Series(True, index=df.index)
        for k, v in sel.items():
            if k in df.columns:
                m &= df[k] == v
        if "category" in df.columns:
            m &= df["category"].isin(cats)
        if with_draft and "draft_kind" in df.columns:
            m &= (df["draft_kind"] == draft) | (df["decoder"] == AUTOREGRESSIVE)
        return df[m]

    return match(rounds, True), match(requests, False)


def _prior_ct(sweep_dir: str):
    """The prior sweep's C_t(k) micro-benchmark rows (jobs with ct_bench=true), or None."""
    from specbench.bench import runstore

    try:
        return runstore.load_sweep(sweep_dir, "ct")
    except (FileNotFoundError, ValueError):
        return None


def model_choice(cfg, spec: StudySpec, runner: _Runner) -> tuple[dict, dict, list]:
    """The cost model's (draft, γ) for a new study, the reference AR rates and raw profile rows.

    Per draft: fit acceptance and timing profiles on a prior sweep's matching rows, else on
    a short profile run (`profile_batches` batches at γ = `profile_gamma`, paired with the
    baseline), then the speedup model's optimal γ. Returns (model, reference, frames).
    """
    import pandas as pd

    from specbench.decoding.records import AUTOREGRESSIVE

    t = cfg.tune
    model: dict = {"source": None, "prediction": {}, "fits": {}, "decode_s": 0.0}
    ar_tok, ar_wall, lat = 0.0, 0.0, []
    frames: list = []
    best: tuple | None = None
    for draft in spec.drafts:
        rounds_df, prior_ct = None, None
        if t.prior_sweep:
            try:
                r, q = _prior_rows(cfg, spec, draft)
                if len(r[r["decoder"] != AUTOREGRESSIVE]) and len(r[r["decoder"] == AUTOREGRESSIVE]):
                    rounds_df, model["source"] = r, f"prior_sweep:{t.prior_sweep}"
                    prior_ct = _prior_ct(t.prior_sweep)
                    qa = q[q["decoder"] == AUTOREGRESSIVE]
                    if len(qa) and "max_new_tokens" in qa and (qa["max_new_tokens"] == cfg.max_new_tokens).any():
                        qa = qa[qa["max_new_tokens"] == cfg.max_new_tokens]
                        ar_tok, ar_wall = float(qa["new_tokens"].sum()), float(qa["wall_time"].sum())
                        lat += (qa["wall_time"] / qa["new_tokens"].where(qa["new_tokens"] > 0)).dropna().tolist()
                else:
                    log.warning("prior sweep %s has no rows for draft=%s, batch_size=%d, sampling=%s, categories=%s; "
                                "profiling instead", t.prior_sweep, draft, spec.batch_size, cfg.sampling.name,
                                spec.categories)  # fmt: skip
            except (FileNotFoundError, ValueError) as exc:
                log.warning("prior sweep %s unusable (%s); profiling instead", t.prior_sweep, exc)
        if rounds_df is None:
            model["source"] = model["source"] or "profile"
            runner.warmup(draft, spec.batches)
            rows = []
            for i, b in enumerate(spec.batches[: t.profile_batches]):
                n = min(t.profile_max_new_tokens or cfg.max_new_tokens, cfg.max_new_tokens)
                rec, rd, qd = runner.measure(draft, t.profile_gamma, spec.batch_size, i, b, 0, n)
                m = record_metrics(rec)
                model["decode_s"] += m["seconds"]
                ar_tok, ar_wall = ar_tok + m["ar_tokens"], ar_wall + m["ar_wall"]
                lat += [w / n for n, w in zip(rec["ar"]["new_tokens"], rec["ar"]["wall_time"]) if n > 0]
                rows.append(rd)
                frames.append((rd, qd))
            rounds_df = pd.concat(rows, ignore_index=True)
        ct = prior_ct
        if ct is None and t.profile_ct:
            ct = _bench_ct(runner, draft, spec, t.gamma_max)
            model["decode_s"] += float(ct["t_forward"].sum())
            frames.append((None, ct))
        try:
            g, s, fit = _fit_prediction(rounds_df, t.gamma_max, ct)
        except (ValueError, KeyError) as exc:
            log.warning("cost model fit failed for draft=%s (%s); falling back to γ=%d", draft, exc, t.profile_gamma)
            g, s, fit = min(t.profile_gamma, t.gamma_max), math.nan, {"curve": {}}
        if g < 1:
            g = min(t.profile_gamma, t.gamma_max)
        model["prediction"][draft] = fit.pop("curve")
        model["fits"][draft] = {**fit, "gamma": g, "speedup": s if math.isfinite(s) else None}
        if best is None or (math.isfinite(s) and (not math.isfinite(best[2]) or s > best[2])):
            best = (draft, g, s)
    model["draft"], model["gamma"] = best[0], int(best[1])
    model["speedup"] = best[2] if math.isfinite(best[2]) else None
    reference = {"ar_tok_s": ar_tok / ar_wall if ar_wall > 0 else None, "ar_latency": _median(lat) if lat else None}
    return model, reference, frames


# --------------------------------------------------------------------------- one study


def _finished(study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def _fail_stale(study) -> None:
    """RUNNING trials of dead processes on this host (a crashed run): FAIL them and enqueue
    their configuration again, so a resumed run measures it."""
    from optuna.trial import TrialState

    host = socket.gethostname()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        w = str(t.user_attrs.get("worker", ""))
        h, _, pid = w.rpartition(":")
        if h != host or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        cfg = _config_of(t)
        if cfg is not None:
            study.enqueue_trial({"draft": cfg[0], "gamma": cfg[1]},
                                user_attrs={"source": "retry", "retry_of": t.number})  # fmt: skip
        log.warning("trial %d of a dead worker (%s) marked FAIL and re-enqueued", t.number, w)


def open_study(cfg, spec: StudySpec, storage, runner: _Runner, sampler, pruner, seen: dict):
    """Load the study, or create it: profile, create (atomically: one worker wins), enqueue the
    cost model's choice as trial 0, then mark it ready. Other workers wait for 'ready'."""
    import optuna

    direction = OBJECTIVES[cfg.tune.objective]
    proto = protocol(cfg, spec)
    try:
        study = optuna.load_study(study_name=spec.name, storage=storage, sampler=sampler, pruner=pruner)
    except KeyError:
        model, reference, frames = model_choice(cfg, spec, runner)
        seen["profile_s"] = model["decode_s"]
        try:
            # load_if_exists=False on purpose: exactly one worker creates the study and enqueues trial 0;
            # a worker that loses the race loads it below (and so resumes it, like load_if_exists=True).
            study = optuna.create_study(study_name=spec.name, storage=storage, direction=direction,
                                        sampler=sampler, pruner=pruner, load_if_exists=False)  # fmt: skip
        except optuna.exceptions.DuplicatedStudyError:
            study = optuna.load_study(study_name=spec.name, storage=storage, sampler=sampler, pruner=pruner)
        else:
            for k, v in {STUDY_MARK: 1, "protocol": proto, "model": model, "reference": reference,
                         "objective": cfg.tune.objective, "units": OBJECTIVE_UNITS[cfg.tune.objective],
                         "workload": spec.workload, "categories": spec.categories, "batch_size": spec.batch_size,
                         "sampling": cfg.sampling.name, "created_by": _worker_id()}.items():  # fmt: skip
                study.set_user_attr(k, v)
            study.enqueue_trial({"draft": model["draft"], "gamma": model["gamma"]},
                                user_attrs={"source": "cost_model"})  # fmt: skip
            study.set_user_attr("ready", True)
            pdir = runner.out_dir / "trials" / _slug(spec.name)
            for i, (rd, qd) in enumerate(frames):
                if rd is None:  # C_t(k) micro-benchmark rows
                    from specbench.bench import runstore

                    runstore.write_table(pdir / f"profile-ct-{i}", "ct", qd)
                    runstore.mark_done(pdir / f"profile-ct-{i}", {"study": spec.name, "kind": "ct"})
                else:
                    _write_rows(pdir / f"profile-{i}", [rd], [qd], {"study": spec.name, "kind": "profile"})
            log.info("study %s created; cost model (%s) -> draft=%s γ=%d (predicted %.2f×), enqueued as trial 0",
                     spec.name, model["source"], model["draft"], model["gamma"], model["speedup"] or math.nan)
    for _ in range(600):  # the creator sets 'ready' right after enqueueing trial 0 (milliseconds)
        if study.user_attrs.get("ready"):
            break
        time.sleep(0.2)
    else:
        raise RuntimeError(f"study {spec.name!r} exists but was never marked ready (its creator died while "
                           "creating it?); delete it or pick another tune.study_name")  # fmt: skip
    stored = study.user_attrs.get("protocol")
    if stored is not None and stored != json.loads(json.dumps(proto)):
        diff = sorted(k for k in set(stored) | set(proto) if stored.get(k) != json.loads(json.dumps(proto)).get(k))
        raise ValueError(
            f"tune.study_name: study {spec.name!r} in this storage was measured with a different protocol "
            f"(differs in {diff}); its trials are not comparable. Use another tune.study_name or tune.storage"
        )
    return study


def _run_trial(cfg, spec: StudySpec, study, trial, runner: _Runner, acc: dict) -> float:
    """Measure one trial batch by batch into `acc`; report per-batch values; raise TrialPruned if pruned."""
    import optuna

    reference = study.user_attrs.get("reference") or {}
    draft = trial.suggest_categorical("draft", spec.drafts)
    gamma = trial.suggest_int("gamma", 1, cfg.tune.gamma_max)
    trial.set_user_attr("worker", _worker_id())
    runner.warmup(draft, spec.batches)
    records = acc["records"]
    for i, batch in enumerate(spec.batches):
        for rep in range(cfg.repeats):
            rec, rd, qd = runner.measure(draft, gamma, spec.batch_size, i, batch, rep)
            records.append(rec)
            acc["rounds"].append(rd)
            acc["requests"].append(qd)
            acc["seconds"] += record_metrics(rec)["seconds"]
        trial.set_user_attr("batches", records)
        trial.set_user_attr("decode_s", acc["seconds"])
        v = objective_value([r for r in records if r["batch"] == i], cfg.tune.objective, reference)
        trial.report(v, step=i)
        if i + 1 < len(spec.batches) and trial.should_prune():
            raise optuna.TrialPruned(f"batch {i}: clearly worse than the best trial on the same batches")
    return objective_value(records, cfg.tune.objective, reference)


def tune_study(cfg, spec: StudySpec, storage, runner: _Runner) -> dict:
    """Run trials of one study until it has `n_trials` finished trials (or the local search converged)."""
    import optuna
    from optuna.trial import TrialState

    t = cfg.tune
    direction = OBJECTIVES[t.objective]
    seed = cfg.seed * 7919 + os.getpid()  # distinct streams for distinct workers
    sampler = make_sampler(t.sampler, spec.drafts, t.gamma_max, seed)
    pruner = _make_pruner(t.prune_margin, t.prune_after, direction, t.prune)
    seen: dict = {"profile_s": 0.0}
    study = open_study(cfg, spec, storage, runner, sampler, pruner, seen)
    _fail_stale(study)
    mine, fails, stop = [], 0, "n_trials"
    while _finished(study) < t.n_trials:
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if t.sampler == "local" and t.stop_when_converged and not waiting and sampler.propose(study) is None:
            stop = "converged"
            break
        trial = study.ask()
        job_dir = runner.out_dir / "trials" / _slug(spec.name) / f"trial-{trial.number:04d}"
        acc: dict = {"records": [], "rounds": [], "requests": [], "seconds": 0.0}
        meta = {"study": spec.name, "trial": trial.number}
        try:
            value = _run_trial(cfg, spec, study, trial, runner, acc)
        except optuna.TrialPruned as exc:
            ft = study.tell(trial, state=TrialState.PRUNED)
            _write_rows(job_dir, acc["rounds"], acc["requests"], {**meta, "state": "pruned", "params": ft.params,
                                                                  "decode_s": acc["seconds"]})  # fmt: skip
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
        _write_rows(job_dir, acc["rounds"], acc["requests"], {**meta, "state": "complete", "value": value,
                                                              "params": ft.params, "decode_s": acc["seconds"]})  # fmt: skip
        _log_trial(spec, ft, "complete", "")
        mine.append(trial.number)
    return {"study": spec.name, "trials_run": mine, "stopped": stop, "finished": _finished(study),
            "profile_s": seen["profile_s"]}


def _log_trial(spec: StudySpec, ft, state: str, note: str) -> None:
    p = ft.params
    b = ft.user_attrs.get("batches") or []
    s = _median(record_metrics(r)["speedup"] for r in b)
    log.info("%s | trial %d %s: draft=%s γ=%s value=%s speedup=%.2f× over %d batch runs, %.1f s %s",
             spec.categories, ft.number, state, p.get("draft"), p.get("gamma"),
             f"{ft.value:.4g}" if ft.value is not None else "-", s, len(b), ft.user_attrs.get("decode_s", 0.0), note)


# --------------------------------------------------------------------------- recommendations


def _pooled(study) -> dict[tuple[str, int], dict]:
    """Per (draft, γ): raw records of all its COMPLETE trials, and its trial count."""
    from optuna.trial import TrialState

    out: dict[tuple[str, int], dict] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        c = _config_of(t)
        if c is None:
            continue
        d = out.setdefault(c, {"records": [], "trials": 0})
        d["records"] += list(t.user_attrs.get("batches") or [])
        d["trials"] += 1
    return out


def compare(a: list[float], b: list[float]) -> float:
    """Two-sided Mann-Whitney U p-value of two sets of per-batch values (NaN if either is empty)."""
    from scipy import stats

    a, b = _finite(a), _finite(b)
    if not a or not b:
        return math.nan
    if len(set(a) | set(b)) == 1:
        return 1.0
    return float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)


def recommend(study, confidence: float = 0.95, n_resamples: int = 2000) -> dict | None:
    """One recommendation row of a study, computed from the raw per-batch records.

    The chosen (draft, γ) has the best objective over its pooled complete trials. Speedup:
    median of per-(batch, repeat) paired speedups with a percentile-bootstrap CI. tok_s =
    speedup × the study's AR tokens/s (Σ AR tokens / Σ AR batch wall over every measured
    batch). Alternatives whose per-batch objective values do not differ from the chosen
    one's (Mann-Whitney p ≥ 1 - confidence) are listed as indistinguishable.
    """
    from optuna.trial import TrialState

    from specbench.costmodel import bootstrap_median_ci

    ua = study.user_attrs
    objective = ua.get("objective", "throughput")
    reference = ua.get("reference") or {}
    pooled = _pooled(study)
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    if not pooled:
        return None
    values = {c: objective_value(d["records"], objective, reference) for c, d in pooled.items()}
    best = None
    for c, v in values.items():
        if best is None or is_better(v, values[best], objective):
            best = c
    if best is None or not math.isfinite(values[best]):
        return None
    recs = pooled[best]["records"]
    speedups = [record_metrics(r)["speedup"] for r in recs]
    s, lo, hi = bootstrap_median_ci(speedups, confidence, n_resamples)
    every = [r for t in finished for r in (t.user_attrs.get("batches") or [])]
    a_tok = sum(record_metrics(r)["ar_tokens"] for r in every)
    a_wall = sum(record_metrics(r)["ar_wall"] for r in every)
    ar_tok_s = a_tok / a_wall if a_wall > 0 else math.nan
    alpha = 1.0 - confidence
    best_vals = list(batch_values_flat(recs, objective, reference))
    alts = []
    for c, d in pooled.items():
        if c == best:
            continue
        p = compare(best_vals, list(batch_values_flat(d["records"], objective, reference)))
        if math.isfinite(p) and p >= alpha:
            alts.append({"draft": c[0], "gamma": c[1], "p": p, "value": values[c],
                         "speedup": _median(record_metrics(r)["speedup"] for r in d["records"])})  # fmt: skip
    alts.sort(key=lambda a: -a["p"])
    multi_draft = len({c[0] for c in pooled}) > 1
    model = ua.get("model") or {}
    verdict = "faster" if lo > 1 else ("slower" if hi < 1 else "not significant")
    return {
        "workload": ua.get("workload"), "categories": ua.get("categories"), "batch_size": ua.get("batch_size"),
        "sampling": ua.get("sampling"), "draft": best[0], "gamma": best[1], "speedup": s, "speedup_lo": lo,
        "speedup_hi": hi, "verdict": verdict, "tok_s": s * ar_tok_s, "ar_tok_s": ar_tok_s, "objective": objective,
        "objective_value": values[best], "n_trials": len(finished),
        "n_complete": sum(t.state == TrialState.COMPLETE for t in finished),
        "n_pruned": sum(t.state == TrialState.PRUNED for t in finished), "n_batches": len(recs),
        "model_gamma": model.get("gamma"), "model_speedup": model.get("speedup"),
        "indistinguishable": "; ".join(_alt_label(a, best, multi_draft) for a in alts),
        "decode_s": decode_seconds(study), "study": study.study_name, "alternatives": alts,
    }  # fmt: skip


def batch_values_flat(records: list[dict], objective: str, reference: dict):
    """Per (batch, repeat) objective values: the unit of the indistinguishability test."""
    for r in records:
        yield objective_value([r], objective, reference)


def _alt_label(a: dict, best: tuple, multi_draft: bool) -> str:
    name = f"{a['draft']} γ={a['gamma']}" if multi_draft else f"γ={a['gamma']}"
    chosen = f"{best[0]} γ={best[1]}" if multi_draft else f"γ={best[1]}"
    return f"{chosen} ≈ {name} (p={a['p']:.2f})"


def decode_seconds(study) -> float:
    """Measurement time spent on a study: Σ decode wall times of its profile and all trials."""
    model = study.user_attrs.get("model") or {}
    return float(model.get("decode_s") or 0.0) + sum(float(t.user_attrs.get("decode_s") or 0.0)
                                                      for t in study.get_trials(deepcopy=False))  # fmt: skip


def recommendation_table(studies, confidence: float = 0.95):
    """The recommendation table (REC_COLUMNS) over studies; `alternatives` kept as a list column."""
    import pandas as pd

    rows = [r for s in studies if (r := recommend(s, confidence)) is not None]
    return pd.DataFrame(rows, columns=REC_COLUMNS + ["alternatives"])


def format_table(df) -> str:
    """Markdown table of the recommendations."""
    if df.empty:
        return "(no complete trials)"
    lines = ["| workload | batch | sampling | draft | γ | speedup [95% CI] | tok/s | trials (pruned) | model γ | indistinguishable |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for _, r in df.iterrows():
        ci = f"{r.speedup:.2f}× [{r.speedup_lo:.2f}, {r.speedup_hi:.2f}]" if math.isfinite(r.speedup_lo) else f"{r.speedup:.2f}×"
        lines.append(f"| {r.workload}[{r.categories}] | {r.batch_size} | {r.sampling} | {r.draft} | {r.gamma} | {ci} | "
                     f"{r.tok_s:.1f} | {r.n_trials} ({r.n_pruned}) | {r.model_gamma} | {r.indistinguishable or '-'} |")  # fmt: skip
    return "\n".join(lines)


def write_recommendations(df, out_dir: Path) -> Path:
    from specbench.bench import runstore

    out_dir = Path(out_dir)
    csv = df.drop(columns=["alternatives"])
    runstore.write_text(out_dir, "recommendations.csv", csv.to_csv(index=False))
    runstore.write_json(out_dir, "recommendations", df.to_dict(orient="records"))
    runstore.write_text(out_dir, "recommendations.md", format_table(df) + "\n")
    return out_dir / "recommendations.md"


def load_tuning_studies(storage) -> list:
    """Every specbench tuning study in a storage."""
    import optuna

    out = []
    for name in optuna.study.get_all_study_names(storage):
        s = optuna.load_study(study_name=name, storage=storage)
        if s.user_attrs.get(STUDY_MARK):
            out.append(s)
    return out


# --------------------------------------------------------------------------- entry point


def run_tune(cfg, out_dir: Path) -> Any:
    """`python -m specbench +tune=gamma`: tune every study of this config; write and print the table."""
    import optuna

    from specbench.bench import runstore
    from specbench.bench.job import encode_workload

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("specbench").setLevel(logging.INFO)
    t = cfg.tune
    out_dir = Path(out_dir)
    url = storage_url(t.storage, cfg.runs_dir)
    storage = open_storage(url)
    runner = _Runner(cfg, out_dir)
    prompts = encode_workload(cfg, runner.pair(t.draft_kinds(cfg)[0]))
    specs = plan_studies(cfg, prompts)
    results = []
    for spec in specs:
        log.info("study %s: %d prompts in %d batches, search draft∈%s γ∈[1,%d], objective %s (%s)", spec.name,
                 len(spec.prompts), len(spec.batches), spec.drafts, t.gamma_max, t.objective, OBJECTIVE_UNITS[t.objective])  # fmt: skip
        results.append(tune_study(cfg, spec, storage, runner))
    import optuna as _o

    studies = [_o.load_study(study_name=s.name, storage=storage) for s in specs]
    for r, s in zip(results, studies):
        r["decode_s"] = decode_seconds(s)
    table = recommendation_table(studies, t.confidence)
    write_recommendations(table, out_dir)
    worker = _slug(_worker_id().replace(":", "-"))
    runstore.write_json(out_dir, f"tune_run-{worker}", {"worker": _worker_id(), "storage": url, "studies": results,
                                                        "warmup_s": runner.warmup_s})  # fmt: skip
    print(f"\nTuning ({t.objective}, {OBJECTIVE_UNITS[t.objective]}), storage {url}:")
    print(format_table(table))
    for r in results:
        print(f"  {r['study']}: {len(r['trials_run'])} trials run here, {r['finished']} finished in the study "
              f"(stopped: {r['stopped']}); measurement time {r['decode_s']:.1f} s (+{runner.warmup_s:.1f} s warm-up)")
    print(f"written: {out_dir}/recommendations.{{csv,json,md}}; browse: optuna-dashboard {url}")
    return table


def main(argv: list[str] | None = None) -> None:
    """`python -m specbench.tune STORAGE [--out DIR]`: the table of every tuning study in a storage."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m specbench.tune", description=main.__doc__)
    ap.add_argument("storage", help="sqlite:///runs/tune/optuna.db, an RDB URL or journal:<path>")
    ap.add_argument("--out", help="write recommendations.{csv,json,md} here")
    ap.add_argument("--confidence", type=float, default=0.95)
    a = ap.parse_args(argv)
    table = recommendation_table(load_tuning_studies(open_storage(a.storage)), a.confidence)
    print(format_table(table))
    if a.out:
        print(f"written: {write_recommendations(table, Path(a.out))}")


if __name__ == "__main__":
    main()

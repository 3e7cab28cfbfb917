"""Studies: storage, the paired pruner, one study per (workload [category], batch size), and
open/create/resume with exactly one worker creating a study and enqueueing the cost model's choice.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from specbench.bench.jobkeys import machine_key
from specbench.bench.workloads import EncodedPrompt, batches_of
from specbench.config import Config
from specbench.tune.objectives import OBJECTIVES
from specbench.tune.paired import worse_p
from specbench.tune.samplers import FIXED, Arm, config_of, policy_choices

log = logging.getLogger("specbench.tune")
STUDY_MARK = "specbench_tune"  # study user attribute that marks a specbench tuning study


# --------------------------------------------------------------------------- storage


def storage_url(spec: str | None, runs_dir: str | os.PathLike = "runs") -> str:
    """The storage spec with the default filled in: sqlite:///<runs_dir>/tune/optuna.db."""
    return str(spec) if spec else f"sqlite:///{Path(runs_dir) / 'tune' / 'optuna.db'}"


def open_storage(spec: str):
    """An Optuna storage: an RDB URL (sqlite://, postgresql://, mysql://...) or a journal file
    (`journal:<path>`, or a path ending in .journal/.log) for workers on a shared disk."""
    journal = spec[len("journal:") :] if spec.startswith("journal:") else None
    if journal is None and "://" not in spec and spec.endswith((".journal", ".log")):
        journal = spec
    if journal is not None:
        journal = journal.removeprefix("//")  # journal:///abs/path or journal:relative/path
        Path(journal).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(journal))
    if "://" not in spec:
        raise ValueError(
            f"tune.storage={spec!r}: must be an RDB URL such as sqlite:///runs/tune/optuna.db, "
            "or journal:<path> for a journal file"
        )
    kwargs: dict = {}
    if spec.startswith("sqlite:///"):
        path = spec[len("sqlite:///") :]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 120}}  # several workers on one file
    return RDBStorage(spec, **kwargs)


def load_tuning_studies(storage) -> list:
    """Every specbench tuning study in a storage."""
    studies = [optuna.load_study(study_name=n, storage=storage) for n in optuna.study.get_all_study_names(storage)]
    return [s for s in studies if s.user_attrs.get(STUDY_MARK)]


# --------------------------------------------------------------------------- pruning


class PairedPruner(optuna.pruners.BasePruner):
    """Prune a trial only when a one-sided paired test says it is worse than the best complete
    trial by more than `margin` on the same prompt batches (`paired.worse_p` on the per-batch
    paired speedups that trials report as intermediate values).

    Looks happen after `min_batches`, `min_batches` + 1, ... measured batches while batches
    remain: at most `n_batches - min_batches` looks, each at level `alpha / looks` (Bonferroni),
    so a trial that is not worse by the margin is pruned with probability ≤ `alpha`.
    """

    def __init__(self, margin: float, alpha: float, min_batches: int, n_batches: int, enabled: bool = True) -> None:
        self.margin, self.min_batches, self.enabled = margin, max(2, min_batches), enabled
        self.level = alpha / max(1, n_batches - self.min_batches)

    def prune(self, study, trial) -> bool:
        iv = trial.intermediate_values
        if not self.enabled or len(iv) < self.min_batches:
            return False
        if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            return False
        p = worse_p(iv, study.best_trial.intermediate_values, self.margin)
        return math.isfinite(p) and p < self.level


# --------------------------------------------------------------------------- planning


@dataclass
class StudySpec:
    """One study: a workload (or one of its categories), a batch size, the job's sampling."""

    name: str
    workload: str
    categories: str
    batch_size: int
    prompts: list[EncodedPrompt]
    drafts: list[str]

    @property
    def batches(self) -> list[list[EncodedPrompt]]:
        return batches_of(self.prompts, self.batch_size)


def slug(text: str, n: int = 100) -> str:
    """A directory name for a study: readable, filesystem-safe, unique (a hash of the full name)."""
    s = re.sub(r"[^A-Za-z0-9._=+-]+", "_", text).strip("_.")
    return f"{s[:n] or 'study'}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def worker_id() -> str:
    """host:pid of this worker (trials record who ran them; stale ones are found by it)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def machine_part(cfg: Config) -> str:
    """The study name's machine part: timings of another machine kind, forward path or dtype never mix."""
    hw = machine_key(cfg.pair.device, cfg.forward.path, cfg.pair.dtype)
    return f"hw={hw}|forward={cfg.forward.path}|dtype={cfg.pair.dtype}"


def default_study_name(cfg: Config, categories: str, batch_size: int, drafts: list[str]) -> str:
    return (
        f"{cfg.pair.name}|{cfg.decoder}|drafts={'+'.join(drafts)}|{cfg.workload.name}[{categories}]"
        f"|b{batch_size}|{cfg.sampling.name}|{cfg.tune.objective}|n{cfg.max_new_tokens}|{machine_part(cfg)}"
    )


def plan_studies(cfg: Config, prompts: list[EncodedPrompt]) -> list[StudySpec]:
    """Studies of a run: per category (tune.split_categories) × per batch size."""
    t = cfg.tune
    drafts = t.draft_kinds(cfg)
    if t.split_categories:
        cats = list(dict.fromkeys(p.category for p in prompts))
        groups = [(c, [p for p in prompts if p.category == c]) for c in cats]
    else:
        groups = [(",".join(cfg.workload.categories) if cfg.workload.categories else "all", prompts)]
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
                name = f"{name}|{machine_part(cfg)}"
            specs.append(StudySpec(name, cfg.workload.name, label, b, ps, drafts))
    return specs


def fingerprint(cfg: Config, spec: StudySpec) -> dict:
    """What makes two runs' trial values comparable; stored in the study and checked on resume."""
    return {
        "pair": cfg.pair.name,
        "target": cfg.pair.target.shape or cfg.pair.target.source,
        "dtype": cfg.pair.dtype,
        "device": cfg.pair.device,
        "decoder": cfg.decoder,
        "workload": spec.workload,
        "categories": spec.categories,
        "batch_size": spec.batch_size,
        "sampling": dataclasses.asdict(cfg.sampling),
        "max_new_tokens": cfg.max_new_tokens,
        "repeats": cfg.repeats,
        "seed": cfg.seed,
        "objective": cfg.tune.objective,
        "drafts": spec.drafts,
        "batches": [[p.prompt_id for p in b] for b in spec.batches],
    }


# --------------------------------------------------------------------------- open / resume


def finished(study) -> int:
    """Finished (complete + pruned) trials of a study: what `tune.n_trials` counts."""
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def fail_stale(study) -> None:
    """RUNNING trials of dead processes on this host (a crashed run): FAIL them and enqueue
    their configuration again, so a resumed run measures it."""
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
        c = config_of(t)
        if c is not None:
            study.enqueue_trial(c.params(), user_attrs={"source": "retry", "retry_of": t.number})
        log.warning("trial %d of a dead worker (%s) marked FAIL and re-enqueued", t.number, w)


def open_study(cfg: Config, spec: StudySpec, storage, sampler, pruner, create: Callable[[], dict[str, Any]]):
    """Load the study, or create it: `create()` (the cost model: profile and its choice) runs first,
    then exactly one worker creates the study (load_if_exists=False), stores `create()`'s user
    attributes, enqueues the model's choice as trial 0 and marks it ready; others wait for 'ready'."""
    proto = json.loads(json.dumps(fingerprint(cfg, spec)))
    try:
        study = optuna.load_study(study_name=spec.name, storage=storage, sampler=sampler, pruner=pruner)
    except KeyError:
        attrs = create()
        try:
            # load_if_exists=False on purpose: exactly one worker creates the study and enqueues trial 0;
            # a worker that loses the race loads it below (and so resumes it, like load_if_exists=True).
            study = optuna.create_study(
                study_name=spec.name,
                storage=storage,
                sampler=sampler,
                pruner=pruner,
                direction=OBJECTIVES.get(cfg.tune.objective).direction,
            )
        except optuna.exceptions.DuplicatedStudyError:
            study = optuna.load_study(study_name=spec.name, storage=storage, sampler=sampler, pruner=pruner)
        else:
            model = attrs["model"]
            for k, v in {
                STUDY_MARK: 1,
                "protocol": proto,
                **attrs,
                "workload": spec.workload,
                "categories": spec.categories,
                "batch_size": spec.batch_size,
                "sampling": cfg.sampling.name,
                "created_by": worker_id(),
            }.items():
                study.set_user_attr(k, v)
            first = Arm(model["draft"], model["gamma"], FIXED if policy_choices(cfg.tune.policies) else None)
            study.enqueue_trial(first.params(), user_attrs={"source": "cost_model"})
            study.set_user_attr("ready", True)
            log.info(
                "study %s created; cost model (%s) -> draft=%s γ=%d (predicted %.2f×), enqueued as trial 0",
                spec.name,
                model["source"],
                model["draft"],
                model["gamma"],
                model["speedup"] or math.nan,
            )
    for _ in range(600):  # the creator sets 'ready' right after enqueueing trial 0 (milliseconds)
        if study.user_attrs.get("ready"):
            break
        time.sleep(0.2)
    else:
        raise RuntimeError(
            f"study {spec.name!r} exists but was never marked ready (its creator died while "
            "creating it?); delete it or pick another tune.study_name"
        )
    stored = study.user_attrs.get("protocol")
    if stored is not None and stored != proto:
        diff = sorted(k for k in set(stored) | set(proto) if stored.get(k) != proto.get(k))
        raise ValueError(
            f"tune.study_name: study {spec.name!r} in this storage was measured with a different protocol "
            f"(differs in {diff}); its trials are not comparable. Use another tune.study_name or tune.storage"
        )
    return study

"""Samplers of the (draft, γ) search, by name: `local` (climb from the cost model's choice)
and Optuna's `tpe`, `random`, `grid`. Adding one = one `SAMPLERS.register`.

Optuna is imported inside the factories on purpose: `specbench.config` validates
`tune.sampler` against this registry before anything heavy loads.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from specbench.registry import Registry

# name -> factory(drafts, gamma_max, seed) -> an optuna sampler
SAMPLERS: Registry[Callable[[list[str], int, int | None], Any]] = Registry("tune.sampler")


def config_of(trial: Any) -> tuple[str, int] | None:
    """(draft, γ) of a trial, enqueued (fixed params) or sampled; None before it has a γ."""
    p = trial.system_attrs.get("fixed_params") or trial.params
    if "gamma" not in p:
        return None
    return (str(p.get("draft")), int(p["gamma"]))


def _all_configs(drafts: list[str], gamma_max: int) -> list[tuple[str, int]]:
    return [(d, g) for d in drafts for g in range(1, gamma_max + 1)]


def local_search_sampler(drafts: list[str], gamma_max: int, seed: int | None):
    """Hill climbing over (draft, γ) from the cost model's choice (enqueued as trial 0).

    Proposes the untried neighbour of the best complete trial (γ±1 with the same draft, the
    other drafts at the same γ), ordered by the cost model's predicted speedup (study attribute
    `model`), γ+1 first when there is none. `propose` returns None when every neighbour has been
    tried (converged); then an untried configuration is drawn at random, and when all are tried
    a random one.
    """
    import optuna
    from optuna.trial import TrialState

    class LocalSearchSampler(optuna.samplers.BaseSampler):
        def __init__(self) -> None:
            self._rng = random.Random(seed)
            self._cache: dict[int, dict] = {}

        def infer_relative_search_space(self, study, trial):
            return {}

        def sample_relative(self, study, trial, search_space):
            return {}

        def propose(self, study) -> dict | None:
            trials = study.get_trials(deepcopy=False)
            tried = {c for t in trials if (c := config_of(t)) is not None}
            complete = [t for t in trials if t.state == TrialState.COMPLETE and config_of(t) is not None]
            pred = (study.user_attrs.get("model") or {}).get("prediction") or {}

            def predicted(c):
                v = (pred.get(c[0]) or {}).get(str(c[1]))
                return v if v is not None else -math.inf

            if not complete:
                untried = [c for c in _all_configs(drafts, gamma_max) if c not in tried]
                if not untried:
                    return None
                best = max(untried, key=lambda c: (predicted(c), -abs(c[1] - 4)))
                return {"draft": best[0], "gamma": best[1]}
            d0, g0 = config_of(study.best_trial)
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
                    tried = {c for t in study.get_trials(deepcopy=False) if (c := config_of(t)) is not None}
                    allc = [c for c in _all_configs(drafts, gamma_max) if c not in tried] or _all_configs(
                        drafts, gamma_max
                    )
                    c = allc[self._rng.randrange(len(allc))]
                    prop = {"draft": c[0], "gamma": c[1]}
                self._cache[trial.number] = prop
            return self._cache[trial.number][param_name]  # proposals lie in the current search space

    return LocalSearchSampler()


def _tpe(drafts: list[str], gamma_max: int, seed: int | None):
    import optuna

    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=3)


def _random(drafts: list[str], gamma_max: int, seed: int | None):
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


def _grid(drafts: list[str], gamma_max: int, seed: int | None):
    import optuna

    return optuna.samplers.BruteForceSampler(seed=seed)


SAMPLERS.register("local", local_search_sampler)
SAMPLERS.register("tpe", _tpe)
SAMPLERS.register("random", _random)
SAMPLERS.register("grid", _grid)

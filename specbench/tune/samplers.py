"""Samplers of the (draft, γ[, policy, tau]) search, by name: `local` (climb from the cost model's choice)
and Optuna's `tpe`, `random`, `grid`. Adding one = one `SAMPLERS.register`.

Optuna is imported inside the factories on purpose: `specbench.config` validates
`tune.sampler` against this registry before anything heavy loads.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from specbench.decoding.policies import POLICIES
from specbench.registry import Registry

FIXED = "fixed"  # the policy every search with tune.policies includes: the best fixed γ is its yardstick
TAUS = tuple(round(0.05 * k, 2) for k in range(1, 20))  # tau's grid, [0.05, 0.95] by 0.05 (the runner's too)
TAU_STEP = 0.05


class Arm(NamedTuple):
    """One configuration a study measures: the draft, γ (γ_max under a policy), and the draft-length policy
    with its tau. policy None: the job's draft.policy (tune.policies unset); tau None: a policy without one."""

    draft: str
    gamma: int
    policy: str | None = None
    tau: float | None = None

    def params(self) -> dict:
        """The trial parameters that name this arm (enqueue_trial's fixed params)."""
        p: dict = {"draft": self.draft, "gamma": self.gamma}
        if self.policy is not None:
            p["policy"] = self.policy
        if self.tau is not None:
            p["tau"] = self.tau
        return p

    def label(self, with_draft: bool = True) -> str:
        head = f"{self.draft} γ={self.gamma}" if with_draft else f"γ={self.gamma}"
        if self.policy in (None, FIXED):
            return head
        return f"{head} {self.policy}" + (f"@{self.tau:g}" if self.tau is not None else "")


def policy_choices(policies: list[str] | None) -> list[str] | None:
    """The policies a study searches: `tune.policies` with `fixed` first (added when missing), None when unset."""
    if not policies:
        return None
    return [FIXED, *dict.fromkeys(p for p in policies if p != FIXED)]


def reads_tau(policy: str | None) -> bool:
    return policy is not None and POLICIES.get(policy, "tune.policies").reads_confidence


def on_grid(tau: float) -> float:
    return min(max(round(round(tau / TAU_STEP) * TAU_STEP, 2), TAUS[0]), TAUS[-1])


@dataclass(frozen=True)
class SearchSpace:
    """What a study searches: drafts, γ in [1, gamma_max], and (`policy_choices`) policies with their tau."""

    drafts: list[str]
    gamma_max: int
    policies: list[str] | None = None

    def arms(self) -> list[Arm]:
        pol = (
            [(p, t) for p in self.policies for t in (TAUS if reads_tau(p) else (None,))]
            if self.policies
            else [(None, None)]
        )
        return [Arm(d, g, p, t) for d in self.drafts for g in range(1, self.gamma_max + 1) for p, t in pol]


# name -> factory(SearchSpace, seed) -> an optuna sampler
SAMPLERS: Registry[Callable[[SearchSpace, int | None], Any]] = Registry("tune.sampler")


def config_of(trial: Any) -> Arm | None:
    """The arm of a trial, enqueued (fixed params) or sampled; None before it has a γ."""
    p = trial.system_attrs.get("fixed_params") or trial.params
    if "gamma" not in p:
        return None
    policy = p.get("policy")
    tau = float(p["tau"]) if "tau" in p and reads_tau(policy) else None
    return Arm(str(p.get("draft")), int(p["gamma"]), None if policy is None else str(policy), tau)


def neighbours(best: Arm, space: SearchSpace, taus: dict[str, float]) -> list[Arm]:
    """Arms one step from `best`, in the order tried on a tie: γ±1, the other drafts at its γ, the other
    policies at its (draft, γ) (tau: the cost model's tau* for that policy, else 0.5), tau ± 0.1."""
    out = [best._replace(gamma=best.gamma + 1), best._replace(gamma=best.gamma - 1)]
    out += [best._replace(draft=d) for d in space.drafts if d != best.draft]
    for p in space.policies or []:
        if p != best.policy:
            out.append(best._replace(policy=p, tau=on_grid(taus.get(p, 0.5)) if reads_tau(p) else None))
    if reads_tau(best.policy) and best.tau is not None:
        out += [best._replace(tau=on_grid(best.tau + d)) for d in (0.1, -0.1)]
    return [a for a in dict.fromkeys(out) if a.draft in space.drafts and 1 <= a.gamma <= space.gamma_max]


def local_search_sampler(space: SearchSpace, seed: int | None):
    """Hill climbing over the study's arms from the cost model's choice (enqueued as trial 0).

    Proposes the untried neighbour of the best complete trial (`neighbours`), ordered by the cost
    model's predicted speedup of its (draft, γ) (study attribute `model`), in `neighbours`' order on a
    tie. `propose` returns None when every neighbour has been tried (converged); then an untried arm
    is drawn at random, and when all are tried a random one.
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

        def propose(self, study) -> Arm | None:
            trials = study.get_trials(deepcopy=False)
            tried = {c for t in trials if (c := config_of(t)) is not None}
            complete = [t for t in trials if t.state == TrialState.COMPLETE and config_of(t) is not None]
            model = study.user_attrs.get("model") or {}
            pred = model.get("prediction") or {}

            def predicted(c):
                v = (pred.get(c.draft) or {}).get(str(c.gamma))
                return v if v is not None else -math.inf

            if not complete:
                first = FIXED if space.policies else None
                untried = [c for c in space.arms() if c.policy == first and c not in tried]
                return max(untried, key=lambda c: (predicted(c), -abs(c.gamma - 4))) if untried else None
            best = config_of(study.best_trial)
            taus = ((model.get("fits") or {}).get(best.draft) or {}).get("tau_star") or {}
            cands = [c for c in neighbours(best, space, taus) if c not in tried]
            if not cands:
                return None
            order = {c: i for i, c in enumerate(cands)}
            return max(cands, key=lambda c: (predicted(c), -order[c]))

        def sample_independent(self, study, trial, param_name, param_distribution):
            if trial.number not in self._cache:
                arm = self.propose(study)
                if arm is None:  # converged or exhausted: an untried arm at random
                    tried = {c for t in study.get_trials(deepcopy=False) if (c := config_of(t)) is not None}
                    arms = [c for c in space.arms() if c not in tried] or space.arms()
                    arm = arms[self._rng.randrange(len(arms))]
                self._cache[trial.number] = arm.params()
            return self._cache[trial.number][param_name]  # proposals lie in the current search space

    return LocalSearchSampler()


def _tpe(space: SearchSpace, seed: int | None):
    import optuna

    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=3)


def _random(space: SearchSpace, seed: int | None):
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


def _grid(space: SearchSpace, seed: int | None):
    import optuna

    return optuna.samplers.BruteForceSampler(seed=seed)


SAMPLERS.register("local", local_search_sampler)
SAMPLERS.register("tpe", _tpe)
SAMPLERS.register("random", _random)
SAMPLERS.register("grid", _grid)

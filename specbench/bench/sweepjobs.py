"""The jobs of a multirun, as Hydra's basic sweeper will launch them: one override list per job.

Why: a sweep's values used to be validated one job at a time, so `-m gamma=2,-1` ran γ = 2 and
then aborted. `specbench.app.SweepSummary.on_multirun_start` composes and validates every job
from this list before the first one runs.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_job_overrides(config: DictConfig) -> list[list[str]]:
    """Every job's overrides (the sweeper's params, then the command line; a later key wins), as
    Hydra's BasicSweeper builds them. ValueError for another sweeper or a sweep it cannot list."""
    sweeper = config.hydra.sweeper
    if sweeper.get("_target_") != BASIC_SWEEPER:
        raise ValueError(f"sweeper {sweeper.get('_target_')} lists its own jobs")
    args = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    args += list(config.hydra.overrides.task)
    per_key: OrderedDict[str, list[str]] = OrderedDict()
    for o in OverridesParser.create().parse_overrides(args):
        key = o.get_key_element()
        if not o.is_sweep_override():
            per_key[key] = [f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            per_key[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            raise ValueError(f"{key}: a {o.value_type} sweep is not listed by the basic sweeper")
    return [list(job) for job in itertools.product(*per_key.values())]

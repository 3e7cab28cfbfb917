"""The Hydra app: `python -m specbench` runs one job; `+sweep=<preset>` runs a multirun.

Jobs land in `runs/<sweep_name>/<overrides>/` beside Hydra's resolved config; a
done job is skipped on re-run, a failed one is recorded and the sweep goes on.
At the end of a multirun, `SweepSummary` prints the one-screen summary table and
writes the sweep's report.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from specbench.bench.jobkeys import JobConflict, register_resolver
from specbench.bench.runstore import ForeignDirError
from specbench.config import Config, register_configs

log = logging.getLogger("specbench")
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")

register_configs()
register_resolver()


def to_config(cfg: DictConfig) -> Config:
    """DictConfig -> validated dataclasses (every `__post_init__` runs here, before any model loads)."""
    return OmegaConf.to_object(cfg)


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    """One job, or one `+tune=gamma` run. In a multirun (`+sweep=...`, `-m`), Hydra calls
    `SweepSummary.on_multirun_end` after the last job: registered in conf/config.yaml under
    `hydra.callbacks.sweep_summary`, it prints the summary table and writes the sweep report."""
    config = _validated(cfg)
    job_dir = Path(HydraConfig.get().runtime.output_dir)
    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    if config.tune.enabled:  # +tune=gamma: an Optuna study instead of one job
        from specbench.tune.runner import run_tune

        run_tune(config, job_dir)
        return
    from specbench.bench.job import run_job  # heavy imports after validation

    try:
        ran = run_job(config, job_dir, OmegaConf.to_yaml(cfg, resolve=True))
    except (ForeignDirError, JobConflict) as exc:  # a folder not ours, or results of another config: touch nothing
        print(f"specbench: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as exc:  # already written to failure.json by run_job
        log.error("FAILED %s: %s: %s", job_dir, type(exc).__name__, exc)
        if HydraConfig.get().mode.name != "MULTIRUN":
            raise SystemExit(1) from None
        return
    if not ran:
        log.info("skipped: %s (done or claimed; force=true re-runs a done job)", job_dir)
    elif HydraConfig.get().mode.name != "MULTIRUN":
        print(_summary(job_dir))


def _validated(cfg: DictConfig) -> Config:
    try:
        return to_config(cfg)
    except ValueError as exc:  # a bad value: say which, and what is allowed; no traceback
        print(f"specbench: invalid config: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _summary(sweep_dir: Path) -> str:
    from specbench.analysis.summary import format_summary, summary_table
    from specbench.bench import runstore

    requests = runstore.load_sweep(sweep_dir, "requests")
    rounds = runstore.load_sweep(sweep_dir, "rounds")
    text = format_summary(summary_table(rounds, requests))
    failures = runstore.load_failures(sweep_dir)
    if len(failures):
        text += "\n\nFAILED jobs (re-run the same command to retry them):\n" + failures[
            ["job", "kind", "message"]
        ].to_string(index=False)
    return text


class SweepSummary(Callback):
    """Validate every job's config before the first one runs; print the summary table and write the
    report when a multirun ends."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from specbench.bench.sweepjobs import sweep_job_overrides

        try:
            jobs = sweep_job_overrides(config)
        except ValueError as exc:  # a sweep Hydra's basic sweeper would refuse too, or another sweeper's
            log.debug("jobs of this multirun not validated ahead: %s", exc)
            return
        for overrides in jobs:
            try:
                cfg = hydra.compose(config_name=config.hydra.job.config_name, overrides=overrides)
            except Exception as exc:  # e.g. an unknown group option in one job
                print(f"specbench: invalid config ({' '.join(overrides)}): {exc}", file=sys.stderr)
                raise SystemExit(2) from None
            _validated(cfg)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            print(_summary(sweep_dir))
        except (ValueError, FileNotFoundError) as exc:
            print(f"no summary for {sweep_dir}: {exc}")
            return
        if config.get("report", True):
            from specbench.report import write_report

            out = write_report(sweep_dir)
            print(f"report: {out['html']}")

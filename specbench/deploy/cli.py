"""`python -m specbench.deploy runs/<sweep>`: a γ schedule per batch size and the engine files that apply it.

Reads the sweep's request rows, computes the paired speedup per (setting, batch size, γ), chooses γ
per batch size (`specbench.deploy.schedule`) and writes schedule.{md,csv,json} plus one file per
engine (`specbench.deploy.engines.ENGINES`) into `--out` (default `runs/<sweep>/deploy/`).
"""

from __future__ import annotations

from pathlib import Path

from specbench.analysis.rows import add_gamma_setting
from specbench.bench.runstore import load_sweep
from specbench.cli_errors import ArgumentParser, int_at_least, run_main
from specbench.decoding.policies import POLICIES
from specbench.deploy.engines import ENGINES
from specbench.deploy.plan import DEFAULT_METRIC, SPEEDUP_METRICS, plan_schedules, write_deployment

PROG = "python -m specbench.deploy"


def run(
    sweep_dir: str | Path,
    out: str | Path | None = None,
    metric: str = DEFAULT_METRIC,
    target: str | None = None,
    draft: str | None = None,
    max_batch_size: int | None = None,
    policy: str = "fixed",
    tau: float = 0.0,
) -> Path:
    """Compute the schedules of a sweep and write schedule.{md,csv,json} and the engine files; returns the out dir."""
    _, requests = add_gamma_setting(load_sweep(sweep_dir, "rounds"), load_sweep(sweep_dir, "requests"))
    try:
        schedules = plan_schedules(requests, metric)
    except ValueError as e:
        raise ValueError(f"{sweep_dir}: {e}") from None
    out_dir = Path(out) if out else Path(sweep_dir) / "deploy"
    write_deployment(schedules, out_dir, target, draft, max_batch_size, policy, tau)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; bad input prints one line naming the problem and exits 2."""
    p = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("sweep_dir", help="runs/<sweep>: a sweep with the autoregressive baseline (baseline=true)")
    p.add_argument("--out", help="output directory (default: <sweep_dir>/deploy)")
    p.add_argument(
        "--metric",
        default=DEFAULT_METRIC,
        choices=SPEEDUP_METRICS.names(),
        help=f"speedup to schedule on (default: {DEFAULT_METRIC})",
    )
    p.add_argument("--target-model", help="target id/path the engines should load (default: the sweep's label)")
    p.add_argument("--draft-model", help="draft id/path the engines should load (default: the sweep's label)")
    p.add_argument(
        "--max-batch-size", type=int_at_least(1), help="extend the last batch-size range up to this (vLLM schedule)"
    )
    p.add_argument(
        "--policy",
        default="fixed",
        choices=[n for n in POLICIES.names() if POLICIES.get(n).lossless],
        help="draft-length policy for the engines' knobs",
    )
    p.add_argument("--tau", type=float, default=0.0, help="its threshold in [0, 1] (transformers, llama.cpp)")
    a = p.parse_args(argv)
    return run_main(PROG, lambda: _deploy(a))


def _deploy(a) -> int:
    if not 0.0 <= a.tau <= 1.0:
        raise ValueError(f"--tau: {a.tau}: must be in [0, 1]")
    out = run(a.sweep_dir, a.out, a.metric, a.target_model, a.draft_model, a.max_batch_size, a.policy, a.tau)
    print((out / "schedule.md").read_text(encoding="utf-8"))
    print(f"wrote {out}/schedule.{{md,csv,json}} and {', '.join(ENGINES.get(n).filename for n in ENGINES)}")
    return 0

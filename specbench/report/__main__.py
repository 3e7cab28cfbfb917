"""CLI: python -m specbench.report runs/<sweep> [--out DIR] [--ct PATH] [--gamma-max N]."""

from __future__ import annotations

from specbench.cli_errors import ArgumentParser, int_at_least, run_main
from specbench.report import write_report

PROG = "python -m specbench.report"


def main(argv=None) -> int:
    """Write report.md / report.html / PNG plots for a sweep and list what was written; bad input prints
    one line naming the problem and exits 2."""
    ap = ArgumentParser(prog=PROG, description="Write report.md / report.html / PNG plots for a sweep.")
    ap.add_argument("sweep_dir", help="runs/<sweep> directory")
    ap.add_argument("--out", default=None, help="output directory (default: <sweep_dir>/report)")
    ap.add_argument("--ct", default=None, help="C_t(k) micro-benchmark table (.parquet/.csv/.json)")
    ap.add_argument(
        "--gamma-max", type=int_at_least(1), default=16, help="largest γ for the model optimum (default 16)"
    )
    args = ap.parse_args(argv)
    return run_main(PROG, lambda: _write(args))


def _write(args) -> int:
    res = write_report(args.sweep_dir, args.out, args.ct, gamma_max=args.gamma_max)
    for p in (res["markdown"], res["html"], *res["figures"], *res["deploy"]):
        print(f"wrote {p}")
    if res["tables"]:
        print(f"wrote {len(res['tables'])} table files into {res['tables'][0].parent}")
    for n in res["notes"]:
        print(f"note: {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""CLI: python -m specbench.report runs/<sweep> [--out DIR] [--ct PATH] [--gamma-max N]."""

from __future__ import annotations

import argparse

from specbench.report import write_report


def main(argv=None) -> int:
    """Write report.md / report.html / PNG plots for a sweep and list what was written."""
    ap = argparse.ArgumentParser(
        prog="python -m specbench.report", description="Write report.md / report.html / PNG plots for a sweep."
    )
    ap.add_argument("sweep_dir", help="runs/<sweep> directory")
    ap.add_argument("--out", default=None, help="output directory (default: <sweep_dir>/report)")
    ap.add_argument("--ct", default=None, help="C_t(k) micro-benchmark table (.parquet/.csv/.json)")
    ap.add_argument("--gamma-max", type=int, default=16, help="largest γ for the model optimum (default 16)")
    args = ap.parse_args(argv)
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

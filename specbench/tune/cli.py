"""`python -m specbench.tune STORAGE [--out DIR]`: the recommendation table of every tuning study in a storage."""

from __future__ import annotations

import argparse
from pathlib import Path

from specbench.tune.recommend import format_table, recommendation_table, write_recommendations
from specbench.tune.study import load_tuning_studies, open_storage


def main(argv: list[str] | None = None) -> None:
    """Print (and with --out, write) the recommendations of every study in STORAGE."""
    ap = argparse.ArgumentParser(prog="python -m specbench.tune", description=__doc__)
    ap.add_argument("storage", help="sqlite:///runs/tune/optuna.db, an RDB URL or journal:<path>")
    ap.add_argument("--out", help="write recommendations.{csv,json,md} here")
    ap.add_argument("--confidence", type=float, default=0.95)
    a = ap.parse_args(argv)
    table = recommendation_table(load_tuning_studies(open_storage(a.storage)), a.confidence)
    print(format_table(table))
    if a.out:
        print(f"written: {write_recommendations(table, Path(a.out))}")

"""`python -m specbench.tune STORAGE [--out DIR]`: the recommendation table of every tuning study in a storage."""

from __future__ import annotations

from argparse import ArgumentTypeError
from pathlib import Path

from specbench.cli_errors import ArgumentParser, run_main
from specbench.tune.recommend import format_table, recommendation_table, write_recommendations
from specbench.tune.study import load_tuning_studies, open_storage

PROG = "python -m specbench.tune"


def _confidence(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value < 1.0:
        raise ArgumentTypeError(f"{text!r}: must be a number in (0, 1), e.g. 0.95")
    return value


def main(argv: list[str] | None = None) -> int:
    """Print (and with --out, write) the recommendations of every study in STORAGE; bad input prints one
    line naming the problem and exits 2."""
    ap = ArgumentParser(prog=PROG, description=__doc__)
    ap.add_argument("storage", help="sqlite:///runs/tune/optuna.db, an RDB URL or journal:<path>")
    ap.add_argument("--out", help="write recommendations.{csv,json,md} here")
    ap.add_argument("--confidence", type=_confidence, default=0.95)
    a = ap.parse_args(argv)
    return run_main(PROG, lambda: _recommend(a))


def _recommend(a) -> int:
    table = recommendation_table(load_tuning_studies(open_storage(a.storage)), a.confidence)
    print(format_table(table))
    if a.out:
        print(f"written: {write_recommendations(table, Path(a.out))}")
    return 0

"""The report names what it could not use (issue 41, point 5): a corrupt table is an error naming the
file, never a silent switch of the C_t source or a dropped section; failed and unfinished jobs are listed."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest
from synthetic import synthetic_sweep

from specbench import report
from specbench.bench import runstore


@pytest.fixture(scope="module")
def sweep():
    return synthetic_sweep(gammas=(1, 2), batch_sizes=(1,), n_prompts=4, new_tokens=24, seed=5)


def _store(sweep, root, floor: bool = False):
    """The synthetic sweep as a run store: one folder per job with rounds, requests and ct (and floor)."""
    r, q, ct = sweep["rounds"], sweep["requests"], sweep["ct"]
    jobs = sorted(r["job"].unique())
    for job in jobs:
        d = root / job
        d.mkdir(parents=True)
        runstore.write_table(d, "rounds", r[r["job"] == job].drop(columns=["job"]))
        runstore.write_table(d, "requests", q[q["job"] == job].drop(columns=["job"]))
        runstore.write_table(d, "ct", ct.drop(columns=[c for c in ("job",) if c in ct]))
        if floor:
            runstore.write_table(d, "floor", pd.DataFrame({"bytes": [1 << 20], "seconds": [1e-4]}))
        runstore.mark_done(d)
    return root, jobs


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_truncated_ct_table_is_named_not_swapped_for_the_rounds(sweep, tmp_path):
    root, jobs = _store(sweep, tmp_path / "sweep")
    assert report.load_tables(root)[2] is not None  # the micro-benchmark table is the C_t source
    _truncate(root / jobs[0] / "ct.parquet")
    with pytest.raises(ValueError, match=rf"{jobs[0]}/ct.parquet"):
        report.load_tables(root)


def test_a_truncated_floor_table_is_named_not_dropped(sweep, tmp_path):
    root, jobs = _store(sweep, tmp_path / "sweep", floor=True)
    _truncate(root / jobs[-1] / "floor.parquet")
    with pytest.raises(ValueError, match=rf"{jobs[-1]}/floor.parquet"):
        report.write_report(root, tmp_path / "out")


def test_a_truncated_rounds_table_is_one_line_from_the_cli(sweep, tmp_path):
    root, jobs = _store(sweep, tmp_path / "sweep")
    _truncate(root / jobs[0] / "rounds.parquet")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "specbench.report", str(root), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert f"{jobs[0]}/rounds.parquet" in line


def test_failed_and_unfinished_jobs_are_listed_in_the_report(sweep, tmp_path):
    root, _ = _store(sweep, tmp_path / "sweep")
    failed = root / "gamma=9"
    failed.mkdir()
    runstore.write_text(failed, "config.yaml", "gamma: 9\n")
    runstore.write_failure(failed, RuntimeError("out of patience at batch 3"))
    unfinished = root / "gamma=7"
    unfinished.mkdir()
    runstore.write_text(unfinished, "config.yaml", "gamma: 7\n")
    runstore.write_table(unfinished, "rounds", sweep["rounds"].head(3).drop(columns=["job"]))
    res = report.write_report(root, tmp_path / "out")
    for text in (res["markdown"].read_text(), res["html"].read_text()):
        assert "gamma=9" in text and "out of patience at batch 3" in text
        assert "gamma=7" in text and "unfinished" in text
    assert any("1 failed" in n and "1 unfinished" in n for n in res["notes"])


def test_build_report_names_a_bad_gamma_max(sweep, tmp_path):
    with pytest.raises(ValueError, match=r"gamma_max=0: must be an integer >= 1"):
        report.build_report(sweep["rounds"], sweep["requests"], sweep["ct"], tmp_path, gamma_max=0)


def test_an_infinite_cell_renders_as_infinity():
    """A ratio over a zero cost is inf: the table cell says so (it raised OverflowError in int(v) before)."""
    from specbench.report.render import fmt_value

    assert fmt_value(float("inf")) == "∞" and fmt_value(float("-inf")) == "−∞"
    assert fmt_value(float("nan")) == "–" and fmt_value(2.0) == "2" and fmt_value(0.5) == "0.500"

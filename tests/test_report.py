"""Report: files written, self-contained HTML, plots present (and skipped with a note when
data is missing), CLI, and a headless-Chromium render check when Chromium is installed."""

from __future__ import annotations

import base64
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specbench import costmodel as cm
from specbench import report

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALL_FIGURES = {"acceptance_by_position.png", "acceptance_by_category.png", "accept_length_vs_gamma.png", "cost_breakdown.png", "ct_k.png",
               "speedup_vs_gamma.png", "tokens_per_second.png"}


@pytest.fixture(scope="module")
def sweep():
    return cm.synthetic_sweep(gammas=(1, 2, 4), alphas={"chat": (0.85, 0.7, 0.6), "code": (0.95, 0.9, 0.85)},
                              batch_sizes=(1, 4), n_prompts=4, new_tokens=40, seed=3)


@pytest.fixture(scope="module")
def built(sweep, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return report.build_report(sweep["rounds"], sweep["requests"], sweep["ct"], out, n_resamples=500)


def test_report_writes_all_files(built):
    out = built["html"].parent
    assert built["markdown"] == out / "report.md" and built["markdown"].stat().st_size > 1000
    assert {p.name for p in built["figures"]} == ALL_FIGURES
    for p in built["figures"]:
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, p
    assert built["notes"] == []
    md = built["markdown"].read_text()
    for name in ALL_FIGURES:
        assert f"]({name})" in md
    for heading in ("## Summary", "## Recommendations", "## Acceptance", "## Component costs", "## Speedup model",
                    "Leave-one-γ-out", "speedup [95% CI]"):
        assert heading in md


def test_html_is_self_contained(built):
    text = built["html"].read_text()
    srcs = re.findall(r"""\bsrc\s*=\s*["']([^"']*)["']""", text)
    assert len(srcs) == len(ALL_FIGURES)
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r"""\b(href|src)\s*=\s*["']?(https?:|//|file:)""", text)
    assert "<link" not in text and "@import" not in text and "<script" not in text
    # the embedded images are exactly the PNG files beside it
    embedded = {base64.b64decode(s.split(",", 1)[1]) for s in srcs}
    assert embedded == {p.read_bytes() for p in built["figures"]}


def test_missing_data_is_skipped_with_a_note(sweep, tmp_path):
    r, q = sweep["rounds"], sweep["requests"]
    one = (r[r["batch_size"] == 1], q[q["batch_size"] == 1])
    res = report.build_report(*one, ct=None, out_dir=tmp_path, n_resamples=200)
    names = {p.name for p in res["figures"]}
    assert "tokens_per_second.png" not in names and "ct_k.png" in names
    assert any("fewer than two batch sizes" in n for n in res["notes"])
    html = res["html"].read_text()
    assert "fewer than two batch sizes" in html and "rounds (fallback)" in html
    # AR-only rows: no speculative plots, still a report
    res = report.build_report(r[r["decoder"] == cm.AUTOREGRESSIVE], q[q["decoder"] == cm.AUTOREGRESSIVE], None,
                              tmp_path / "ar_only", n_resamples=200)
    assert res["html"].exists() and {p.name for p in res["figures"]} == {"ct_k.png"}


def test_cli_main_writes_report(sweep, tmp_path, capsys):
    if importlib.util.find_spec("specbench.bench.runstore") is None:
        pytest.skip("specbench.bench.runstore not available")
    from specbench.bench import runstore

    sweep_dir = tmp_path / "sweep"
    r, q = (t[t["batch_size"] == 1] for t in (sweep["rounds"], sweep["requests"]))
    for job in r["job"].unique():
        d = sweep_dir / job
        d.mkdir(parents=True)
        runstore.write_table(d, "rounds", r[r["job"] == job].drop(columns=["job"]))
        runstore.write_table(d, "requests", q[q["job"] == job].drop(columns=["job"]))
        runstore.mark_done(d)
    # an unfinished job is not reported
    (sweep_dir / "unfinished").mkdir()
    runstore.write_table(sweep_dir / "unfinished", "rounds", r.head(3).drop(columns=["job"]))
    loaded = report.load_tables(sweep_dir)
    assert loaded[2] is None and len(loaded[0]) == len(r) and set(loaded[0]["job"]) == set(r["job"])
    ct_path = tmp_path / "ct.csv"
    sweep["ct"].to_csv(ct_path, index=False)
    out = tmp_path / "out"
    assert report.main([str(sweep_dir), "--out", str(out), "--ct", str(ct_path), "--resamples", "200"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'report.html'}" in printed
    assert (out / "report.html").exists() and (out / "report.md").exists()
    assert "micro-benchmark table" in (out / "report.md").read_text()


@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs /usr/bin/chromium")
def test_html_renders_non_blank_in_chromium(built, tmp_path):
    png = tmp_path / "shot.png"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_report_html.py"), str(built["html"]),
                           "--png", str(png)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK")
    # and the checker does reject a blank page
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body style='background:#fff'></body></html>")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_report_html.py"), str(blank),
                           "--png", str(tmp_path / "blank.png")], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1 and proc.stdout.startswith("BLANK")

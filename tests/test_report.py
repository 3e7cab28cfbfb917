"""Report: files written, self-contained HTML, plots present (and skipped with a note when
data is missing), CLI, and a headless-Chromium render check when Chromium is installed."""

from __future__ import annotations

import base64
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from synthetic import synthetic_sweep

from specbench import report
from specbench.decoding.records import AUTOREGRESSIVE
from specbench.report.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALL_FIGURES = {
    "acceptance_by_position.png",
    "acceptance_by_category.png",
    "accept_length_vs_gamma.png",
    "cost_breakdown.png",
    "ct_k.png",
    "speedup_vs_gamma.png",
    "tokens_per_second.png",
    "acceptance_length_histogram.png",
}


@pytest.fixture(scope="module")
def sweep():
    return synthetic_sweep(
        gammas=(1, 2, 4),
        alphas={"chat": (0.85, 0.7, 0.6), "code": (0.95, 0.9, 0.85)},
        batch_sizes=(1, 4),
        n_prompts=4,
        new_tokens=40,
        seed=3,
    )


@pytest.fixture(scope="module")
def built(sweep, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return report.build_report(sweep["rounds"], sweep["requests"], sweep["ct"], out)


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
    for heading in (
        "## Summary",
        "## Recommendations",
        "## Acceptance",
        "## Component costs",
        "## Speedup model",
        "Leave-one-γ-out",
        "latency speedup: median [95% CI] n prompts",
        "throughput speedup: median [95% CI] n batches",
        "exact order-statistic",
    ):
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
    res = report.build_report(*one, ct=None, out_dir=tmp_path)
    names = {p.name for p in res["figures"]}
    assert "tokens_per_second.png" not in names and "ct_k.png" in names
    assert any("fewer than two batch sizes" in n for n in res["notes"])
    html = res["html"].read_text()
    assert "fewer than two batch sizes" in html and "rounds (fallback)" in html
    # AR-only rows: no speculative plots, still a report
    res = report.build_report(
        r[r["decoder"] == AUTOREGRESSIVE], q[q["decoder"] == AUTOREGRESSIVE], None, tmp_path / "ar_only"
    )
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
    assert main([str(sweep_dir), "--out", str(out), "--ct", str(ct_path)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'report.html'}" in printed
    assert (out / "report.html").exists() and (out / "report.md").exists()
    assert "micro-benchmark table" in (out / "report.md").read_text()


def test_serving_metrics_are_in_the_report_and_its_tables(built, sweep):
    out = built["html"].parent
    md = built["markdown"].read_text()
    for text in (
        "## Serving metrics",
        "Mean acceptance length (vLLM definition)",
        "conditional α_i (specbench)",
        "unconditional, vLLM-style",
        "Per-request acceptance",
        "P50 ms",
        "P95 ms",
        "P99 ms",
        "len 1",
        "## Memory",
        "KV cache per row (MiB)",
        "peak memory: not recorded",
    ):
        assert text in md, text
    tables = {p.name for p in built["tables"]}
    for name in (
        "recommendations",
        "schedule_throughput",
        "schedule_latency",
        "mean_acceptance_length",
        "acceptance_length_histogram",
        "acceptance_by_position_both",
        "latency_percentiles",
        "kv_bytes",
    ):
        assert {f"{name}.csv", f"{name}.json"} <= tables, name
    # the CSV is the raw rows' numbers: vLLM's mean acceptance length = 1 + Σaccepted / Σrounds per job γ
    mal = pd.read_csv(out / "tables" / "mean_acceptance_length.csv")
    r = sweep["rounds"][(sweep["rounds"]["decoder"] == "speculative")]
    for (w, b, g), sub in r.groupby(["workload", "batch_size", "gamma"]):
        row = mal[(mal["workload"] == w) & (mal["batch_size"] == b) & (mal["gamma_setting"] == g)]
        assert row["mean_acceptance_length"].item() == pytest.approx(1 + sub["accepted"].sum() / len(sub))
    lat = json.loads((out / "tables" / "latency_percentiles.json").read_text())
    assert {d["decoder"] for d in lat} == {"speculative", AUTOREGRESSIVE}
    assert {d["metric"] for d in lat} == {"ttft", "tpot", "e2e"}
    kv = pd.read_csv(out / "tables" / "kv_bytes.csv")
    assert (kv.loc[kv["decoder"] == AUTOREGRESSIVE, "draft KV MiB (max)"] == 0).all()
    assert (kv.loc[kv["decoder"] == "speculative", "draft KV MiB (median)"] > 0).all()


def test_two_batch_sizes_give_a_schedule_and_engine_files(built):
    out = built["html"].parent
    md = built["markdown"].read_text()
    assert "## γ schedule per batch size" in md and "throughput speedup" in md and "latency speedup" in md
    names = {p.relative_to(out).as_posix() for p in built["deploy"]}
    # two workloads: one folder of engine files per setting
    for p in built["deploy"]:
        assert p.exists() and f"]({p.relative_to(out).as_posix()})" in md
        assert f"href='{p.relative_to(out).as_posix()}'" in built["html"].read_text()
    sched = json.loads((out / "deploy" / "schedule.json").read_text())
    assert {s["metric"] for s in sched} == {"throughput"} and len(sched) == 2
    assert [c["batch_size"] for c in sched[0]["choices"]] == [1, 4]
    for name in names:
        text = (out / name).read_text()
        if name.endswith(".json"):
            json.loads(text)
        if name.endswith("vllm.txt"):
            line = next(ln for ln in text.splitlines() if ln.startswith("vllm serve"))
            argv = shlex.split(line)
            if "--speculative-config" in argv:
                json.loads(argv[argv.index("--speculative-config") + 1])
    assert sum(n.endswith("vllm.txt") for n in names) == 2


def test_one_batch_size_has_no_schedule(sweep, tmp_path):
    r, q = (t[t["batch_size"] == 1] for t in (sweep["rounds"], sweep["requests"]))
    res = report.build_report(r, q, None, tmp_path)
    assert res["deploy"] == [] and not (tmp_path / "deploy").exists()
    assert "γ schedule per batch size: skipped (fewer than two batch sizes" in res["markdown"].read_text()


def test_context_sweep_adds_measured_vs_model_section(tmp_path):
    s = synthetic_sweep(
        gammas=(2, 4),
        batch_sizes=(1,),
        n_prompts=6,
        new_tokens=24,
        context_tokens=(128, 512, 2048),
        ct={"ctx": 2e-5},
        seed=1,
    )
    res = report.build_report(s["rounds"], s["requests"], s["ct"], tmp_path)
    assert "context_length.png" in {p.name for p in res["figures"]}
    assert "## Context length" in res["markdown"].read_text()
    t = pd.read_csv(tmp_path / "tables" / "context_sweep.csv")
    assert t["context tokens"].tolist() == [128, 512, 2048]
    # C_t(1) grows by 2e-5 s per context token: 38 ms from 128 to 2048, far above the 2% noise
    assert (t["C_t(1) ms measured"].diff().dropna() > 5).all()
    assert t["C_t(1) ms model"].to_numpy() == pytest.approx(t["C_t(1) ms measured"].to_numpy(), rel=0.1)
    assert set(t["best γ measured"]) <= {2, 4} and (t["γ* model"] >= 1).all()
    # an ordinary sweep (one context per setting and γ) has no context section
    plain = report.build_report(
        s["rounds"][s["rounds"]["job"].str.endswith("_c128")],
        s["requests"][s["requests"]["job"].str.endswith("_c128")],
        s["ct"],
        tmp_path / "p",
    )
    assert "## Context length" not in plain["markdown"].read_text()


def test_peak_memory_hook_shows_recorded_peaks(sweep, tmp_path):
    r, q = (t[t["batch_size"] == 1] for t in (sweep["rounds"], sweep["requests"]))
    q = q.assign(peak_rss_bytes=512 * 2**20)
    meta = pd.DataFrame({"job": q["job"].unique(), "telemetry.peak_cuda_bytes": 3 * 2**30})
    res = report.build_report(r, q, None, tmp_path, meta=meta)
    peak = pd.read_csv(tmp_path / "tables" / "peak_memory.csv")
    assert set(peak.columns) == {"job", "peak_rss_bytes (MiB)", "peak_cuda_bytes (MiB)"}
    assert (peak["peak_rss_bytes (MiB)"] == 512).all() and (peak["peak_cuda_bytes (MiB)"] == 3072).all()
    assert "Peak memory per job (MiB)" in res["markdown"].read_text()


@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs /usr/bin/chromium")
def test_html_renders_non_blank_in_chromium(built, tmp_path):
    png = tmp_path / "shot.png"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "check_report_html.py"), str(built["html"]), "--png", str(png)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK")
    # and the checker does reject a blank page
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body style='background:#fff'></body></html>")
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "check_report_html.py"),
            str(blank),
            "--png",
            str(tmp_path / "blank.png"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 1 and proc.stdout.startswith("BLANK")

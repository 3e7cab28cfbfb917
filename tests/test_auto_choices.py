"""`auto` choices made from timings (pair.dtype=auto, gemv rows, weight-only kernel rows) are made once per
machine and software version: the first process times them and writes them to specbench's cache, every later
process reads them, and each job records them. The decision rules are tested on given timings only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import eager_cli

from specbench.models import choices

ROOT = Path(__file__).resolve().parents[1]

# Every auto choice that times kernels, as a job makes them; with NO_TIMING=1 every timer raises first.
CHOOSE = r"""
import json, os
import torch
torch.set_num_threads(1)
from specbench.models import kernels, loading, quant
if os.environ.get("NO_TIMING") == "1":
    def timed_again(*a, **k):
        raise AssertionError("a cached choice was timed again")
    kernels.interleaved_medians = loading.interleaved_medians = quant._median_time = timed_again
layer = quant.Int8Linear(torch.nn.Linear(64, 96, bias=False, dtype=torch.bfloat16))
print(json.dumps({
    "dtype": loading.auto_dtype("cpu", "int8"),
    "kernel_rows": layer.kernel_rows,
    "gemv_rows": kernels.gemv_rows(96, 64, kernels.prepack_supported(), 1 << 20),
}))
from specbench.models import choices
print(json.dumps({name: c["from"] for name, c in choices.record()["choices"].items()}))
"""


def _start(cache: Path, no_timing: bool) -> subprocess.Popen:
    env = {**os.environ, "SPECBENCH_CACHE": str(cache), "NO_TIMING": "1" if no_timing else "0", "PYTHONPATH": str(ROOT)}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen(
        [sys.executable, "-c", CHOOSE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _result(proc: subprocess.Popen) -> tuple[dict, dict]:
    """(the choices, {choice name: 'measured' | 'cache'}) a process printed."""
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-1500:]
    chosen, sources = out.strip().splitlines()[-2:]
    return json.loads(chosen), json.loads(sources)


def _choose(cache: Path, no_timing: bool) -> dict:
    return _result(_start(cache, no_timing))[0]


def test_a_second_process_reads_the_cached_choices_instead_of_timing_again(tmp_path):
    first = _choose(tmp_path / "cache", no_timing=False)
    second = _choose(tmp_path / "cache", no_timing=True)  # fails if anything is timed again
    assert second == first
    (cache_file,) = (tmp_path / "cache" / "choices").glob("*.json")
    names = set(json.loads(cache_file.read_text())["choices"])
    assert any(n.startswith("dtype") for n in names) and any(n.startswith("gemv_rows") for n in names)
    assert any(n.startswith("kernel_rows") for n in names)


def test_two_processes_starting_together_time_each_choice_once(tmp_path):
    first, second = (_result(p) for p in [_start(tmp_path, False), _start(tmp_path, False)])
    assert first[0] == second[0]
    assert set(first[1]) == set(second[1])
    for name in first[1]:  # the file is locked while one times: the other reads its answer
        assert sorted([first[1][name], second[1][name]]) == ["cache", "measured"], name


def test_gemv_rows_rule_on_given_timings():
    from specbench.models.kernels import NEAR_TIE, pick_gemv_rows

    def t(*pairs):
        return {str(rows): {"gemv": g, "other": o} for rows, (g, o) in zip((1, 2, 4, 8), pairs)}

    assert pick_gemv_rows(t((1.0, 2.0), (1.0, 2.0), (3.0, 2.0), (1.0, 2.0))) == 2  # stops at the first loss
    assert pick_gemv_rows(t((2.0, 1.0))) == 0
    assert pick_gemv_rows(t((NEAR_TIE, 1.0))) == 0  # a near-tie goes to the kernel that equals torch's
    assert pick_gemv_rows(t((0.5, 1.0), (0.5, 1.0), (0.5, 1.0), (0.5, 1.0))) == 8


def test_kernel_rows_rule_on_given_timings():
    from specbench.models.quant import pick_kernel_rows

    def t(*pairs):
        return {str(rows): {"kernel": k, "gemm": g} for rows, (k, g) in zip((1, 2, 4, 8, 16), pairs)}

    assert pick_kernel_rows(t((1.0, 5.0), (1.0, 5.0), (2.0, 5.0), (6.0, 5.0), (1.0, 5.0))) == 4
    assert pick_kernel_rows(t((5.0, 5.0))) == 1  # a tie keeps the kernel
    assert pick_kernel_rows(t((6.0, 5.0))) == 0
    assert pick_kernel_rows({}) == 0


def _given_dtype_timings(bf16_round: float, fp32_round: float) -> dict:
    return {
        "bfloat16": {"target": bf16_round / 2, "draft": bf16_round / 8, "round": bf16_round},
        "float32": {"target": fp32_round / 2, "draft": fp32_round / 8, "round": fp32_round},
    }


@pytest.mark.parametrize("fp32_round, expected", [(5.0, "float32"), (9.5, "bfloat16")])
def test_load_pair_resolves_dtype_auto_with_its_draft_from_the_cached_choice(
    tmp_path, monkeypatch, fp32_round, expected
):
    """The W8A16 draft's choice (given timings: fp32's round 50% or 5% shorter) decides the pair's dtype."""
    from specbench.config import DraftConfig, ModelConfig, PairConfig
    from specbench.models import choices, loading
    from specbench.models.pair import load_pair

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    loading.fastest_cpu_dtype.cache_clear()
    name = loading.dtype_choice_name("int8", "tuned")
    given = _given_dtype_timings(10.0, fp32_round)
    assert choices.cached(name, lambda: given, loading.pick_dtype) == (expected, given)
    try:
        tiny = ModelConfig(source=None, shape="tiny-llama")
        pair = load_pair(PairConfig(name="tiny", target=tiny, draft=tiny, dtype="auto"), DraftConfig(kind="w8a16"))
        assert str(pair.target.dtype) == f"torch.{expected}" and pair.draft_model.dtype == pair.target.dtype
        assert loading.resolve_dtype("auto", "cpu", "int8") == getattr(__import__("torch"), expected)
    finally:
        loading.fastest_cpu_dtype.cache_clear()  # the next test reads its own cache


def test_a_job_records_its_auto_choices(tmp_path):
    args = ["pair=tiny", "pair.dtype=auto", "draft=w8a16", "workload=synthetic", "report=false", "ct_bench=false"]
    args += ["max_new_tokens=4", "workload.n_prompts=1", "sweep_name=auto", f"runs_dir={tmp_path / 'runs'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "SPECBENCH_CACHE": str(tmp_path / "cache")}
    result = subprocess.run(eager_cli(*args), capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    (job,) = (tmp_path / "runs").glob("auto/*")
    record = json.loads((job / "done.json").read_text())["auto_choices"]
    (cache_file,) = (tmp_path / "cache" / "choices").glob("*.json")
    assert record["file"] == str(cache_file)
    cached = json.loads(cache_file.read_text())
    assert record["key"] == cached["key"]
    dtype = record["choices"][next(n for n in record["choices"] if n.startswith("dtype"))]
    assert dtype["chosen"] in ("bfloat16", "float32") and dtype["from"] in ("cache", "measured")
    from specbench.models.draft_kinds import draft_class, resolve_kind

    kind = record["draft_kind"]  # draft.kind=auto is a lookup on the CPU class: recorded, no timing
    assert kind == {"kind": "w8a16", "auto": resolve_kind("auto", "cpu"), "cpu_class": draft_class("cpu", "auto")}


def test_the_suites_choices_are_kept_apart_from_a_users(monkeypatch):
    """Choices timed by the suite (1 thread, beside other tests) went into the file a user's 1-thread job reads."""
    assert choices.machine_key()["switches"]["SPECBENCH_CHOICES_SCOPE"] == "tests"
    suite = choices.cache_file()
    monkeypatch.delenv("SPECBENCH_CHOICES_SCOPE")
    assert choices.cache_file() != suite and choices.cache_file().parent == suite.parent

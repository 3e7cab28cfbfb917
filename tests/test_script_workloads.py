"""The benchmark scripts find Spec-Bench as the configs do, and a wrong path fails at once with the flag named."""

import importlib.util
import sys
from pathlib import Path

import pytest

from specbench.bench.workloads import SPEC_BENCH_ENV, default_spec_bench_path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("draft_agreement",)


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_missing_spec_bench_file_exits_naming_the_flag_and_path(name, tmp_path, monkeypatch):
    missing = tmp_path / "nowhere" / "question.jsonl"
    argv = [name, "--spec-bench", str(missing), "--out", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        load_script(name).main()
    message = str(exit_info.value.code)
    assert message.startswith(f"--spec-bench {missing}:")
    assert "workload file not found" in message and SPEC_BENCH_ENV in message
    assert not (tmp_path / "out").exists()  # nothing written: it stopped before any work


def test_the_default_path_is_the_configs(monkeypatch):
    monkeypatch.setenv(SPEC_BENCH_ENV, "/data/question.jsonl")
    assert default_spec_bench_path() == "/data/question.jsonl"
    monkeypatch.delenv(SPEC_BENCH_ENV)
    yaml = (ROOT / "conf" / "workload" / "spec_bench.yaml").read_text()
    assert f"${{oc.env:{SPEC_BENCH_ENV},{default_spec_bench_path()}}}" in yaml

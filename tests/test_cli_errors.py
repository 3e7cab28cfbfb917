"""Every command's bad input: ONE line on stderr naming the argument, the value and what is allowed; exit 2.

Each case runs the real command in a subprocess (issue 41, point 9).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_cli(module: str, *args: str, cwd=None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *words: str) -> str:
    """Exit 2, no traceback, one stderr line containing every word; returns that line."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert len(lines) == 1, result.stderr[-3000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_shared_helpers_print_one_line(capsys):
    from specbench.cli_errors import ArgumentParser, int_at_least, run_main

    parser = ArgumentParser(prog="prog")
    parser.add_argument("--threads", type=int_at_least(1))
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--threads", "-1"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "prog: error: argument --threads: -1: must be an integer >= 1\n"

    def bad():
        raise ValueError("first line\nsecond line")

    assert run_main("prog", bad) == 2
    assert capsys.readouterr().err == "prog: error: first line; second line\n"


def test_report_gamma_max_zero_is_one_line(tmp_path):
    line = assert_one_line_error(run_cli("specbench.report", str(tmp_path), "--gamma-max", "0"), "--gamma-max", "0")
    assert ">= 1" in line


def test_report_missing_sweep_is_one_line(tmp_path):
    assert_one_line_error(run_cli("specbench.report", str(tmp_path / "missing")), "does not exist")


def test_deploy_bad_input_is_one_line_through_the_shared_helper(tmp_path):
    assert_one_line_error(run_cli("specbench.deploy", str(tmp_path / "missing")), "specbench.deploy: error:")
    assert_one_line_error(run_cli("specbench.deploy", str(tmp_path), "--max-batch-size", "0"), "--max-batch-size")


@pytest.mark.parametrize(
    "args, words",
    [
        (["--threads", "-1"], ["--threads", "-1", ">= 1"]),
        (["--prompts", "-1"], ["--prompts", "-1", ">= 1"]),
        (["--prompts", "0"], ["--prompts", "0", ">= 1"]),
        (["--gamma", "0"], ["--gamma", "0", ">= 1"]),
        (["--banned-token-ids", "99999"], ["--banned-token-ids", "99999", "vocab"]),
        (["--prompts", "7"], ["--prompts", "7", "2 built-in prompts"]),
    ],
)
def test_audit_bad_arguments_are_one_line(args, words, tmp_path):
    assert_one_line_error(run_cli("specbench.audit", *args, "--out", str(tmp_path)), *words)


def test_audit_too_few_samples_for_a_joint_test_is_an_error_not_a_pass(tmp_path):
    result = run_cli("specbench.audit", "--samples", "20", "--tokens", "3", "--out", str(tmp_path))
    assert "PASS" not in result.stdout, result.stdout
    assert_one_line_error(result, "--samples", "20", "joint")


def test_tune_bad_storage_is_one_line(tmp_path):
    assert_one_line_error(run_cli("specbench.tune", "notastorage"), "specbench.tune: error:")


def test_tune_refuses_a_bad_storage_without_loading_torch():
    """Reading a study's recommendations needs optuna and pandas, not torch: the error came after ~5 s of importing
    torch and transformers (the prompt type the tuner's studies hold lived in the benchmark protocol's module)."""
    code = (
        "import sys\nfrom specbench.tune.cli import main\ncode = main(['notastorage'])\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\nsys.exit(code)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.stdout.strip() == "False False", result.stdout + result.stderr[-2000:]
    assert_one_line_error(result, "specbench.tune: error:", "notastorage")


@pytest.mark.parametrize(
    "args, word",
    [(["--threads", "-1"], "--threads"), (["--decoder", "nope"], "nope"), (["--samples", "3"], "--samples")],
)
def test_audit_refuses_a_bad_argument_without_loading_torch(args, word):
    """The audit checks its arguments and decoder names before torch and transformers load: the error came
    after ~5 s of imports (the package and the CLI imported the decoders at module level)."""
    code = (
        "import sys\nfrom specbench.audit.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit as exc:\n    code = exc.code\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\nsys.exit(code)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.stdout.strip() == "False False", result.stdout + result.stderr[-2000:]
    assert_one_line_error(result, "error:", word)

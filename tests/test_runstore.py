"""Run store: atomic writes, done/failed/incomplete jobs, job ids, sweep loading."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from conftest import eager_cli

from specbench.bench import runstore as rs


def _files(d: Path) -> set[str]:
    return {p.name for p in d.iterdir() if p.is_file()}


def _tmp_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith(rs.TMP_PREFIX))


# ------------------------------------------------------------------ writing


def test_write_table_roundtrip_and_no_temp_left(tmp_path: Path) -> None:
    df = pd.DataFrame({"round": [0, 1, 2], "t_round": [0.1, 0.2, 0.3], "extra": ["bonus", "recovered", "step"]})
    path = rs.write_table(tmp_path / "job", "rounds", df)
    assert path == tmp_path / "job" / "rounds.parquet"
    pd.testing.assert_frame_equal(pd.read_parquet(path), df)
    assert _files(tmp_path / "job") == {"rounds.parquet"}
    # overwrite replaces whole
    rs.write_table(tmp_path / "job", "rounds.parquet", df.iloc[:1])
    assert len(pd.read_parquet(path)) == 1


def test_failed_write_leaves_old_file_and_no_temp(tmp_path: Path) -> None:
    good = pd.DataFrame({"a": [1, 2]})
    rs.write_table(tmp_path, "t", good)
    bad = pd.DataFrame({"a": [1, object()]})  # pyarrow cannot convert an arbitrary object
    with pytest.raises(ValueError):  # pyarrow.ArrowInvalid
        rs.write_table(tmp_path, "t", bad)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "t.parquet"), good)
    assert _tmp_files(tmp_path) == []
    with pytest.raises(TypeError):
        rs.write_table(tmp_path, "t", [1, 2])  # type: ignore[arg-type]


def test_write_json_and_text(tmp_path: Path) -> None:
    p = rs.write_json(tmp_path, "env", {"x": np.int64(3), "p": Path("/a"), "arr": np.arange(2), "d": torch.float32})
    assert p.name == "env.json"
    assert json.loads(p.read_text()) == {"x": 3, "p": "/a", "arr": [0, 1], "d": "torch.float32"}
    t = rs.write_text(tmp_path, "config.yaml", "gamma: 4\n")
    assert t.read_text() == "gamma: 4\n"
    for bad in ("done", "failure.json"):
        with pytest.raises(ValueError, match="reserved"):
            rs.write_json(tmp_path, bad, {})
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(ValueError):
            rs.write_text(tmp_path, bad, "")
    assert _tmp_files(tmp_path) == []


# ------------------------------------------------------------------ job lifecycle


def test_prepare_job_dir_lifecycle(tmp_path: Path) -> None:
    job = tmp_path / "sweep" / "gamma=4"
    assert rs.prepare_job_dir(job) is True and job.is_dir()
    rs.write_table(job, "rounds", pd.DataFrame({"a": [1]}))
    rs.write_text(job, "main.log", "hydra log\n")
    (job / ".hydra").mkdir()
    (job / ".hydra" / "config.yaml").write_text("x: 1\n")
    (job / f"{rs.TMP_PREFIX}rounds.parquet.abc").write_bytes(b"PAR1 partial")
    assert not rs.is_done(job)

    # interrupted attempt: re-running wipes stale tables and temp files, keeps logs and dirs
    assert rs.prepare_job_dir(job) is True
    assert _files(job) == {"main.log"}
    assert (job / ".hydra" / "config.yaml").is_file()

    rs.write_table(job, "rounds", pd.DataFrame({"a": [1]}))
    done = rs.mark_done(job, {"params": {"gamma": 4}})
    assert rs.is_done(job)
    meta = json.loads(done.read_text())
    assert meta["params"] == {"gamma": 4} and "finished_at" in meta

    # done: skipped, untouched
    assert rs.prepare_job_dir(job) is False
    assert {"rounds.parquet", "done.json"} <= _files(job)
    # forced: cleaned and not done any more
    assert rs.prepare_job_dir(job, force=True) is True
    assert not rs.is_done(job) and _files(job) == {"main.log"}

    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(NotADirectoryError):
        rs.prepare_job_dir(f)


def test_failure_is_not_done_and_is_retried(tmp_path: Path) -> None:
    job = tmp_path / "s" / "j"
    rs.prepare_job_dir(job)
    try:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    except RuntimeError as e:
        path = rs.write_failure(job, e, extra={"batch_size": 64})
    rec = json.loads(path.read_text())
    assert rec["kind"] == "oom" and rec["type"] == "builtins.RuntimeError"
    assert "Tried to allocate" in rec["message"] and "Traceback" in rec["traceback"]
    assert rec["batch_size"] == 64 and rec["time"]
    assert not rs.is_done(job)

    fails = rs.load_failures(tmp_path / "s")
    assert list(fails["job"]) == ["j"] and list(fails["kind"]) == ["oom"]

    assert rs.prepare_job_dir(job) is True  # retried, old failure cleared
    assert _files(job) == set()
    try:
        raise ValueError("bad config")
    except ValueError as e:
        rec = json.loads(rs.write_failure(job, e, kind="error").read_text())
    assert rec["kind"] == "error"
    rs.mark_done(job, {})  # success after a failure: failure.json goes away
    assert _files(job) == {"done.json"}
    assert rs.load_failures(tmp_path / "s").empty


# ------------------------------------------------------------------ oom


def test_is_oom_real_cpu_allocation_failure() -> None:
    with pytest.raises(RuntimeError) as info:
        torch.empty(2**62, dtype=torch.uint8)  # impossible: the allocator refuses at once
    assert rs.is_oom(info.value)


def test_is_oom_classification() -> None:
    assert rs.is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert rs.is_oom(MemoryError())
    assert rs.is_oom(RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"))
    assert rs.is_oom(OSError(12, "Cannot allocate memory"))
    assert not rs.is_oom(RuntimeError("shape mismatch"))
    assert not rs.is_oom(ValueError("out of memory"))  # wrong type: a config message, not an OOM
    try:
        try:
            raise MemoryError()
        except MemoryError as inner:
            raise RuntimeError("batch failed") from inner
    except RuntimeError as outer:
        assert rs.is_oom(outer)


# ------------------------------------------------------------------ loading


def _job(root: Path, rel: str, n: int, done: bool = True) -> None:
    job = root / rel
    rs.prepare_job_dir(job)
    rs.write_table(job, "rounds", pd.DataFrame({"round": range(n), "t_round": [0.1] * n}))
    if done:
        rs.mark_done(job, {"params": {"rel": rel}})


def test_load_sweep_any_depth_done_only(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    _job(sweep, "gamma=2", 3)
    _job(sweep, "draft=ngram/gamma=4", 2)
    _job(sweep, "draft=ngram/gamma=8", 5, done=False)  # interrupted
    failed = sweep / "gamma=16"
    rs.prepare_job_dir(failed)
    rs.write_failure(failed, MemoryError(), kind="oom")

    df = rs.load_sweep(sweep)
    assert list(df.columns) == ["job", "round", "t_round"]
    assert sorted(df["job"].unique()) == ["draft=ngram/gamma=4", "gamma=2"]
    assert len(df) == 5
    assert list(rs.load_failures(sweep)["job"]) == ["gamma=16"]
    assert sorted(rs.load_meta(sweep)["params.rel"]) == ["draft=ngram/gamma=4", "gamma=2"]

    # re-running the interrupted job never duplicates rows
    _job(sweep, "draft=ngram/gamma=8", 5)
    assert rs.prepare_job_dir(sweep / "draft=ngram/gamma=8") is False  # done now: skipped
    df = rs.load_sweep(sweep)
    assert (df["job"] == "draft=ngram/gamma=8").sum() == 5


def test_load_sweep_errors(tmp_path: Path) -> None:
    (tmp_path / "runs" / "other").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="other"):
        rs.load_sweep(tmp_path / "runs" / "missing")
    sweep = tmp_path / "runs" / "s"
    _job(sweep, "a", 2, done=False)
    rs.prepare_job_dir(sweep / "b")
    rs.write_failure(sweep / "b", RuntimeError("boom"))
    with pytest.raises(ValueError, match=r"no finished jobs.*1 failed.*1 incomplete"):
        rs.load_sweep(sweep)
    _job(sweep, "c", 2)
    with pytest.raises(ValueError, match="requests.parquet.*rounds.parquet"):
        rs.load_sweep(sweep, table="requests")
    assert rs.load_failures(tmp_path / "runs" / "other").empty


# ------------------------------------------------------------------ kill -9

_WRITER = textwrap.dedent(
    """
    import importlib.util, sys, numpy as np, pandas as pd
    # load runstore.py by path: the package __init__ imports torch/transformers (slow)
    spec = importlib.util.spec_from_file_location("runstore", sys.argv[3])
    runstore = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runstore)
    write_table = runstore.write_table
    job, n = sys.argv[1], int(sys.argv[2])
    x = np.random.default_rng(0).random(n)
    i = 0
    while True:
        write_table(job, "rounds", pd.DataFrame({"i": np.full(n, i), "x": x}))
        write_table(job, f"t{i % 3}", pd.DataFrame({"i": np.full(n, i), "x": x}))
        i += 1
    """
)


def test_sigkill_mid_write_leaves_no_partial_table(tmp_path: Path) -> None:
    n = 1_000_000
    expected_x = np.random.default_rng(0).random(n)
    job = tmp_path / "job"
    caught_tmp = False
    for _attempt in range(3):
        rs.prepare_job_dir(job)
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(job), str(n), rs.__file__])
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                assert proc.poll() is None, "writer exited early"
                if (job / "rounds.parquet").exists() and _tmp_files(job) and len(list(job.glob("t*.parquet"))) >= 1:
                    break
                time.sleep(0.002)
            else:
                pytest.fail("writer never got going")
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL

        tables = sorted(job.glob("*.parquet"))
        assert tables, "at least one table was complete before the kill"
        for t in tables:  # every visible table is complete and self-consistent
            tab = pq.read_table(t).to_pandas()
            assert len(tab) == n, t
            assert tab["i"].nunique() == 1
            np.testing.assert_array_equal(tab["x"].to_numpy(), expected_x)
        if _tmp_files(job):
            caught_tmp = True
            assert not rs.is_done(job)
            assert rs.prepare_job_dir(job) is True
            assert _files(job) == set()  # temp files and stale tables all gone
            break
    assert caught_tmp, "the kill never landed during a write (3 tries)"


# ------------------------------------------------------------------ issue 41: folders, names, claims, machines

TINY_JOB = ["pair=tiny", "workload=synthetic", "workload.n_prompts=2", "max_new_tokens=8", "warmup=0", "draft=ngram"]
TINY_JOB += ["report=false", "threads=1"]
_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _sb(args: list[str], cwd: Path, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """`python -m specbench <args>` in `cwd`, a real Hydra run."""
    return subprocess.run(
        eager_cli(*args),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env or _ENV,
        **kw,
    )


def _done_jobs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob(rs.DONE_FILE))


def test_prepare_job_dir_deletes_only_what_specbench_wrote(tmp_path: Path) -> None:
    job = tmp_path / "sweep" / "gamma=4"
    rs.prepare_job_dir(job)
    rs.write_table(job, "rounds", pd.DataFrame({"a": [1]}))
    (job / "notes.txt").write_text("mine\n")  # a user's file in a specbench job folder
    assert rs.prepare_job_dir(job) is True
    assert _files(job) == {"notes.txt"}
    # a non-empty folder that specbench never prepared is refused, and nothing in it is touched
    other = tmp_path / "keep"
    other.mkdir()
    (other / "notes.txt").write_text("x\n")
    with pytest.raises(rs.ForeignDirError, match=f"{other}.*not a specbench job folder"):
        rs.prepare_job_dir(other)
    assert _files(other) == {"notes.txt"} and not (other / rs.MARK_DIR).exists()


def test_a_job_refuses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("x\n")
    result = _sb([*TINY_JOB, "hydra.run.dir=keep"], tmp_path)
    assert (keep / "notes.txt").read_text() == "x\n"
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = [ln for ln in result.stderr.splitlines() if "specbench:" in ln]
    assert "keep" in line and "not a specbench job folder" in line and "Traceback" not in result.stderr
    assert not (keep / "config.yaml").exists()


def test_values_with_slashes_and_dotdot_neither_merge_jobs_nor_leave_runs(tmp_path: Path) -> None:
    args = ["-m", "gamma=1,2", *TINY_JOB, "workload.name=../../../outside/w", "runs_dir=runs", "sweep_name=s"]
    result = _sb(args, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"], "a job folder left runs/"
    jobs = _done_jobs(tmp_path / "runs" / "s")
    assert len(jobs) == 2, jobs
    gammas = {int(pd.read_parquet(j / "requests.parquet").gamma_setting.iloc[0]) for j in jobs}
    assert gammas == {1, 2}
    assert all(j.parent == tmp_path / "runs" / "s" for j in jobs)


def test_sweep_name_cannot_climb_out_of_runs(tmp_path: Path) -> None:
    result = _sb([*TINY_JOB, "runs_dir=runs", "sweep_name=../out"], tmp_path)
    assert result.returncode == 2 and "sweep_name='../out': must be a folder inside runs_dir" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "something was written"


def test_a_done_job_with_another_config_is_an_error_naming_both(tmp_path: Path) -> None:
    preset = tmp_path / "conf" / "sweep" / "mine.yaml"
    preset.parent.mkdir(parents=True)
    preset.write_text("# @package _global_\nsweep_name: mine\nmax_new_tokens: 8\n")
    args = ["--config-dir", str(tmp_path / "conf"), "+sweep=mine", *TINY_JOB[:3], "warmup=0", "draft=ngram"]
    args += ["report=false", "runs_dir=runs"]
    first = _sb(args, tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    preset.write_text("# @package _global_\nsweep_name: mine\nmax_new_tokens: 6\n")  # the preset was edited
    second = _sb(args, tmp_path)
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    (line,) = [ln for ln in second.stderr.splitlines() if "specbench:" in ln]
    assert "max_new_tokens" in line and "8" in line and "6" in line and "Traceback" not in second.stderr
    (job,) = _done_jobs(tmp_path / "runs" / "mine")
    assert str(job.relative_to(tmp_path)) in line


def test_a_bad_value_anywhere_in_a_sweep_stops_it_before_the_first_job(tmp_path: Path) -> None:
    result = _sb(["-m", "gamma=2,-1", *TINY_JOB, "runs_dir=runs", "sweep_name=bad"], tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    (line,) = [ln for ln in result.stderr.splitlines() if "specbench:" in ln]
    assert "gamma=-1: must be an integer >= 0" in line
    assert not list(tmp_path.rglob("env.json")), "a job ran before the sweep was validated"


def test_a_job_done_on_another_kind_of_machine_is_run_again_not_skipped(tmp_path: Path) -> None:
    args = [*TINY_JOB, "runs_dir=runs", "sweep_name=m"]
    assert _sb(args, tmp_path).returncode == 0
    other = _sb(args, tmp_path, env={**_ENV, "ATEN_CPU_CAPABILITY": "default"})  # the portable kernels
    assert other.returncode == 0, other.stderr[-2000:]
    jobs = _done_jobs(tmp_path / "runs" / "m")
    assert len(jobs) == 2, f"the second machine kind skipped the first one's job: {jobs}"
    keys = {json.loads((j / rs.DONE_FILE).read_text())["machine"]["key"] for j in jobs}
    assert len(keys) == 2


def test_study_names_carry_hardware_forward_path_and_dtype() -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from specbench.app import CONF_DIR, to_config
    from specbench.bench.jobkeys import machine_key
    from specbench.tune.study import default_study_name

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = to_config(compose("config", overrides=["pair=tiny", "forward=static"]))
    name = default_study_name(cfg, "all", 1, ["ngram"])
    key = machine_key(cfg.pair.device, cfg.forward.path, cfg.pair.dtype)
    assert key in name and "forward=static" in name and "dtype=float32" in name


_HOLDER = textwrap.dedent(
    """
    import sys
    from specbench.bench import claims
    claim = claims.try_claim(sys.argv[1])
    print("held" if isinstance(claim, claims.Claim) else "refused", flush=True)
    sys.stdin.read()  # hold the claim until the test closes stdin
    """
)


def _holder(job: Path) -> subprocess.Popen:
    """A real worker process holding the claim on `job` until its stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(job)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
    return proc


def test_a_claim_is_exclusive_and_a_stale_one_is_taken_over(tmp_path: Path) -> None:
    from specbench.bench import claims

    job = tmp_path / "job"
    holder = _holder(job)
    try:
        held = claims.try_claim(job)
        assert isinstance(held, dict) and held["pid"] == holder.pid  # a live worker of this host: skip
    finally:
        holder.kill()  # SIGKILL: the claim stays behind, stale
        holder.wait()
    claim = claims.try_claim(job)
    assert isinstance(claim, claims.Claim) and claim.record["pid"] == os.getpid()
    claim.release()
    assert not (job / rs.MARK_DIR / claims.CLAIM_FILE).exists()

    lock = job / rs.MARK_DIR / claims.CLAIM_FILE  # another host's claim: live until it is too old
    lock.write_text(json.dumps({"host": "elsewhere", "boot_id": "b", "pid": 1, "start": None, "time": "t"}))
    assert isinstance(claims.try_claim(job), dict)
    old = time.time() - claims.STALE_AFTER_S - 60
    os.utime(lock, (old, old))
    claim = claims.try_claim(job)
    assert isinstance(claim, claims.Claim)
    lock.unlink()
    lock.write_text(json.dumps({"host": "elsewhere", "pid": 2}))  # a successor's claim: release leaves it
    claim.release()
    assert json.loads(lock.read_text())["pid"] == 2


def test_a_job_claimed_by_a_live_worker_is_skipped_then_run_once_released(tmp_path: Path) -> None:
    job = tmp_path / "runs" / "c" / "job"
    args = [*TINY_JOB, "runs_dir=runs", "sweep_name=c", "hydra.run.dir=runs/c/job"]
    holder = _holder(job)
    try:
        skipped = _sb(args, tmp_path)
    finally:
        holder.communicate(b"")  # releases the claim and exits
    assert skipped.returncode == 0, skipped.stderr[-2000:]
    assert f"claimed by {socket.gethostname()}:{holder.pid}" in skipped.stdout + skipped.stderr
    assert not (job / "env.json").exists() and not rs.is_done(job)
    ran = _sb(args, tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert rs.is_done(job) and not (job / rs.MARK_DIR / "claim.lock").exists()


_SAME = {
    "requests": ["decoder", "prompt_id", "repeat", "batch", "row", "prompt_tokens", "new_tokens", "rounds"],
    "rounds": ["decoder", "prompt_id", "repeat", "batch", "round", "row", "gamma", "accepted", "committed"],
}


def _runs_of(job: Path, outputs: list[str]) -> int:
    """How many workers ran `job`: each running worker draws its progress bar, named after the job folder."""
    return sum(f"{job.name}:   0%" in out for out in outputs)


def _results(sweep: Path) -> dict[str, pd.DataFrame]:
    out = {}
    for table, cols in _SAME.items():
        df = rs.load_sweep(sweep, table)
        out[table] = df.assign(job=df.job.str.replace(r",hw=.*", "", regex=True))[["job", *cols]]
        out[table] = out[table].sort_values(["job", *cols]).reset_index(drop=True)
    return out


@pytest.mark.parametrize("sweep", [[], ["-m", "gamma=1,2,3"]], ids=["one_job", "one_sweep"])
def test_two_workers_race_each_job_runs_once_and_results_match_one_worker(tmp_path: Path, sweep: list[str]) -> None:
    args = [*sweep, *TINY_JOB, "sweep_name=race"]
    cmd = eager_cli(*args)
    workers = [
        subprocess.Popen(
            [*cmd, "runs_dir=runs"], cwd=tmp_path, env=_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    outputs = [b"".join(w.communicate(timeout=300)).decode() for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs[0][-1500:] + outputs[1][-1500:]
    solo = _sb([*args, "runs_dir=solo"], tmp_path)
    assert solo.returncode == 0, solo.stderr[-2000:]

    jobs = _done_jobs(tmp_path / "runs" / "race")
    assert len(jobs) == max(1, len(sweep) and 3)
    for job in jobs:
        assert _runs_of(job, outputs) == 1, f"{job.name} ran {_runs_of(job, outputs)} times"
        assert not list(job.glob(".tmp.*")) and not (job / rs.MARK_DIR / "claim.lock").exists()
        done = json.loads((job / rs.DONE_FILE).read_text())
        assert done["claim"]["pid"] in {w.pid for w in workers}
        expected = _files(_done_jobs(tmp_path / "solo")[0]) | {"app.log"}
        assert _files(job) | {"app.log"} == expected  # no file lost
    mine, theirs = _results(tmp_path / "runs" / "race"), _results(tmp_path / "solo" / "race")
    for table in _SAME:
        pd.testing.assert_frame_equal(mine[table], theirs[table])

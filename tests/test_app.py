"""The Hydra app: every config composes, bad input fails before loading, sweeps resume."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import eager_cli
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import open_dict

from specbench.app import CONF_DIR, to_config
from specbench.config import Config

CONF = Path(CONF_DIR)
TINY = ["pair=tiny", "draft=model", "workload=synthetic", "report=false"]


def _compose(overrides: list[str], hydra: bool = False):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=overrides, return_hydra_config=hydra)


def _group_files(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize(
    "override",
    [f"{g}={name}" for g in ("pair", "draft", "workload", "sampling", "forward") for name in _group_files(g)]
    + [f"+sweep={name}" for name in _group_files("sweep")],
)
def test_every_config_composes_and_validates(override):
    extra = ["workload.path=traffic.jsonl"] if override == "workload=jsonl" else []
    if override in ("draft=model",):
        extra.append("pair=tiny")
    cfg = _compose([override, *extra], hydra=override.startswith("+sweep"))
    if override.startswith("+sweep"):
        assert cfg.hydra.mode.name == "MULTIRUN" and cfg.hydra.sweeper.params
        with open_dict(cfg):
            del cfg["hydra"]
    assert isinstance(to_config(cfg), Config)


def test_sweep_summary_callback_is_registered():
    # SweepSummary (specbench.app) runs at the end of every multirun only because conf/config.yaml registers it.
    cfg = _compose([], hydra=True)
    assert cfg.hydra.callbacks.sweep_summary._target_ == "specbench.app.SweepSummary"


def test_launcher_configs_compose():
    for name in ("local_parallel", "slurm", "submitit_local_test"):
        cfg = _compose([f"hydra/launcher={name}"], hydra=True)
        assert "_target_" in cfg.hydra.launcher


def _run(args: list[str], runs: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        eager_cli(*args, f"runs_dir={runs}"),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["draft=eagle"], "Available options in 'draft'"),
        (["workload=nope"], "Available options in 'workload'"),
        (["gamma=-1"], "gamma=-1: must be an integer >= 0"),
        (["sampling.temperature=-1"], "sampling.temperature=-1.0: must be a number >= 0"),
        (["sampling.top_p=1.5"], "sampling.top_p=1.5: must be in (0, 1]"),
        (["decoder=specbench"], "decoder='specbench': must be one of ['speculative', 'hf_assisted', 'llama_cpp']"),
        (["extra_decoders=[speculative]"], "extra_decoders=['speculative']: repeats decoder='speculative'"),
        (["extra_decoders=[hf_assisted]", "batch_size=2"], "decoder='hf_assisted' supports batch_size=1 only"),
    ],
)
def test_bad_input_fails_before_loading_with_the_choices(args, message, tmp_path):
    result = _run(args, tmp_path, timeout=120)
    assert result.returncode != 0
    assert message in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    assert not any(tmp_path.rglob("env.json"))  # no job started


def test_gamma_zero_runs_the_plain_decoder_through_the_same_protocol(tmp_path):
    # γ = 0 is "speculation off", a choice like any γ: the same protocol (warm-up, seeds, labels, store).
    result = _run([*TINY, "max_new_tokens=5", "workload.n_prompts=2", "gamma=0", "sweep_name=off"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    job = next(tmp_path.glob("off/*"))
    assert (job / "done.json").exists()
    requests, rounds = pd.read_parquet(job / "requests.parquet"), pd.read_parquet(job / "rounds.parquet")
    assert set(requests.decoder) == set(rounds.decoder) == {"autoregressive"}
    assert set(requests.gamma_setting) == {0} and set(rounds.gamma) == {0} and len(requests) == 2
    assert set(requests.new_tokens) == {5}
    assert requests.peak_rss_bytes.iloc[0] > 0 and requests.peak_rss_bytes.nunique() == 1  # one peak per job


def test_extra_decoders_are_interleaved_in_one_job_with_one_baseline(tmp_path):
    args = [*TINY, "max_new_tokens=5", "workload.n_prompts=2", "extra_decoders=[hf_assisted]", "sweep_name=cmp"]
    result = _run(args, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    (job,) = tmp_path.glob("cmp/*")
    requests = pd.read_parquet(job / "requests.parquet")
    assert sorted(requests.decoder) == ["autoregressive"] * 2 + ["hf_assisted"] * 2 + ["speculative"] * 2
    from specbench.analysis.speedup import latency_speedup

    table = latency_speedup(requests.assign(job="cmp"), ["decoder"])
    assert sorted(table.decoder) == ["hf_assisted", "speculative"]  # each paired with the one shared baseline
    from specbench.analysis.speedup import head_to_head

    (row,) = head_to_head(requests.assign(job="cmp"), ["decoder"]).to_dict("records")
    assert (row["decoder"], row["versus"], row["n_prompts"]) == ("speculative", "hf_assisted", 2)
    wall = requests.set_index("decoder").wall_time / requests.set_index("decoder").new_tokens
    per_prompt = (wall["hf_assisted"].to_numpy() / wall["speculative"].to_numpy()).tolist()
    assert row["latency_speedup"] == pytest.approx(sorted(per_prompt)[0] / 2 + sorted(per_prompt)[1] / 2)


def test_single_job_writes_the_store_and_prints_a_summary(tmp_path):
    result = _run([*TINY, "max_new_tokens=6", "workload.n_prompts=2", "sweep_name=one"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "speedup" in result.stdout
    job = next(tmp_path.glob("one/*"))
    for name in ("config.yaml", "env.json", "rounds.parquet", "requests.parquet", "done.json", ".hydra/config.yaml"):
        assert (job / name).exists(), name
    requests = pd.read_parquet(job / "requests.parquet")
    assert sorted(requests.decoder.unique()) == ["autoregressive", "speculative"]
    assert len(requests) == 4 and set(requests.prompt_id) == {"synthetic-00", "synthetic-01"}
    # The job's γ setting is a column of every row; round rows keep their own per-round gamma.
    rounds = pd.read_parquet(job / "rounds.parquet")
    assert set(requests.gamma_setting) == set(rounds.gamma_setting) == {4} and "gamma_config" not in requests
    assert set(rounds.loc[rounds.decoder == "autoregressive", "gamma"]) == {0}


def test_killed_sweep_resumes_without_rerunning_or_duplicating(tmp_path):
    """SIGKILL a gamma sweep mid-way, re-run it: done jobs are skipped, nothing is doubled."""
    args = ["+sweep=gamma", *TINY, "max_new_tokens=24", "workload.n_prompts=3", "warmup=0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        eager_cli(*args, f"runs_dir={tmp_path}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    sweep = tmp_path / "gamma"
    deadline = time.time() + 240
    while len(list(sweep.glob("*/done.json"))) < 2:
        assert proc.poll() is None, "sweep ended before it could be killed"
        assert time.time() < deadline, "no job finished in time"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = {p.parent.name: p.stat().st_mtime_ns for p in sweep.glob("*/done.json")}
    assert 2 <= len(done_before) < 8

    result = _run(args, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    done_after = {p.parent.name: p.stat().st_mtime_ns for p in sweep.glob("*/done.json")}
    assert len(done_after) == 8
    for job, mtime in done_before.items():
        assert done_after[job] == mtime, f"{job} was re-run"
    for job_dir in sweep.glob("*/"):
        requests = pd.read_parquet(job_dir / "requests.parquet")
        assert len(requests) == 3 * 2  # 3 prompts x (baseline, speculative), exactly once
        assert not requests.duplicated(["decoder", "prompt_id", "repeat"]).any()
        assert not list(job_dir.glob(".tmp.*"))
    from specbench.bench.runstore import load_sweep

    rounds = load_sweep(sweep, "rounds")
    assert sorted(rounds[rounds.decoder == "speculative"].gamma.unique()) == list(range(1, 9))


@pytest.mark.parametrize("launcher", ["local_parallel", "submitit_local_test"])
def test_launchers_run_a_real_multirun(launcher, tmp_path):
    args = [
        *TINY,
        f"hydra/launcher={launcher}",
        "hydra.mode=MULTIRUN",
        "threads=1",
        "gamma=1,2",
        "max_new_tokens=6",
        "workload.n_prompts=2",
        "warmup=0",
        "sweep_name=launch",
    ]
    result = _run(args, tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(list((tmp_path / "launch").glob("*/done.json"))) == 2

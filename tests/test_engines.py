"""Engines behind one protocol (`specbench.engines`): one registration adds an engine to jobs, configs and
the report; a job interleaves every engine with its baseline; the report sets each against each baseline."""

from __future__ import annotations

import pandas as pd
import pytest

from specbench.config import Config, DraftConfig, ForwardConfig, ModelConfig, PairConfig, WorkloadConfig
from specbench.engines import ENGINES, TORCH, Engine, register
from specbench.engines.specbench_decoders import open_autoregressive, torch_costs

TOY = "toy_plain"


def tiny_config(**kw) -> Config:
    """The shape-only tiny pair (float32, a 1-layer draft), 2 synthetic prompts, a few tokens, no warm-up; the fast
    path uncompiled (compiled jobs are test_fast_path.py's; here its compile was ~40 s of the file)."""
    kw.setdefault("forward", ForwardConfig(path="static"))
    pair = PairConfig(
        name="tiny",
        target=ModelConfig(None, shape="tiny-llama"),
        draft=ModelConfig(None, shape="tiny-llama"),
        dtype="float32",
    )
    return Config(
        pair=pair,
        draft=DraftConfig(kind="model"),
        workload=WorkloadConfig(name="synthetic", kind="synthetic", n_prompts=2, prompt_tokens=12),
        max_new_tokens=6,
        warmup=0,
        threads=1,
        **kw,
    )


def test_every_engine_names_a_registered_plain_baseline():
    for name in ENGINES:
        e = ENGINES.get(name)
        assert e.name == name and e.baseline in ENGINES, name
        assert not ENGINES.get(e.baseline).speculative, f"{name}'s baseline {e.baseline} drafts"


@pytest.fixture
def toy_engine():
    """specbench's autoregressive decoder registered under a new name: a plain engine of its own."""
    register(Engine(TOY, baseline=TOY, runtime=TORCH, open=open_autoregressive, description="toy", costs=torch_costs))
    yield TOY
    ENGINES.unregister(TOY)


def test_a_new_engine_is_one_registration(toy_engine, tmp_path):
    from specbench.bench.job import run_job
    from specbench.bench.runstore import load_sweep
    from specbench.report import write_report

    assert run_job(tiny_config(extra_decoders=[toy_engine], ct_bench=False), tmp_path / "job")
    req = load_sweep(tmp_path, "requests")
    assert set(req["decoder"]) == {"autoregressive", "speculative", toy_engine}
    toy, ar = (req[req["decoder"] == n].set_index("prompt_id") for n in (toy_engine, "autoregressive"))
    assert (toy["gamma"] == 0).all() and toy["new_tokens"].equals(ar["new_tokens"])
    engines = pd.read_csv(write_report(tmp_path)["markdown"].parent / "tables" / "engines.csv")
    assert {(toy_engine, "autoregressive"), ("speculative", toy_engine)} <= set(zip(engines.decoder, engines.baseline))
    ENGINES.unregister(toy_engine)
    with pytest.raises(ValueError, match=f"extra_decoders\\[\\]='{toy_engine}': must be one of"):
        tiny_config(extra_decoders=[toy_engine])


def test_engine_limits_are_checked_by_the_config():
    with pytest.raises(ValueError, match="batch_size=2: decoder='hf_generate' supports batch_size=1 only"):
        tiny_config(extra_decoders=["hf_generate"], batch_size=2)
    with pytest.raises(ValueError, match="decoder='hf_generate': must be one of"):
        tiny_config(decoder="hf_generate")  # a plain engine is a baseline, not the job's speculative decoder
    with pytest.raises(ValueError, match="with decoder='hf_assisted': it needs a draft model"):
        Config(draft=DraftConfig(kind="ngram"), extra_decoders=["hf_assisted"])


def test_a_missing_llama_cpp_binary_fails_the_job_before_loading_naming_the_build(tmp_path):
    from specbench.bench.job import run_job
    from specbench.llama_cpp.binaries import LlamaCppMissing

    cfg = Config(decoder="llama_cpp", max_new_tokens=4, warmup=0)
    cfg.llama_cpp.bin_dir = str(tmp_path / "no-binaries")
    with pytest.raises(
        LlamaCppMissing,
        match=r"no executable llama-server there; build them once with `bash scripts/build_llama_cpp.sh`",
    ):
        run_job(cfg, tmp_path / "job")


def test_an_engines_job_and_its_report_sections(tmp_path):
    """Every torch engine and its baseline in one tiny job (llama.cpp's need the embedded pair: see
    test_llama_cpp.py); the report has both engines sections with per-prompt rows."""
    from specbench.bench.job import run_job
    from specbench.bench.runstore import load_sweep
    from specbench.report import write_report

    assert run_job(tiny_config(extra_decoders=["hf_generate", "hf_assisted"]), tmp_path / "job")
    req = load_sweep(tmp_path, "requests")
    assert sorted(req["decoder"].unique()) == sorted(["autoregressive", "hf_generate", "speculative", "hf_assisted"])
    out = write_report(tmp_path)
    md = out["markdown"].read_text()
    for title in (
        "## Engines head to head",
        "Each engine against each baseline",
        "Per prompt",
        "## Engines at the hardware floor",
    ):
        assert title in md, title
    tables = out["markdown"].parent / "tables"
    engines = pd.read_csv(tables / "engines.csv")
    pairs = set(zip(engines.decoder, engines.baseline))
    assert {
        ("speculative", "autoregressive"),
        ("hf_assisted", "autoregressive"),
        ("hf_assisted", "hf_generate"),
    } <= pairs
    assert (engines["n"] == 2).all()
    per_prompt = pd.read_csv(tables / "engines_per_prompt.csv")
    assert len(per_prompt) == 2 and "speculative ÷ autoregressive" in per_prompt.columns
    floors = pd.read_csv(tables / "engines_floors.csv")
    assert list(floors["decoder"]) == ["speculative"]
    assert floors[["E[N]", "C_t1", "C_d per token", "c = C_d/C_t1", "ideal at matvec floors"]].notna().all().all()
    from specbench.models import cpu_bf16

    if cpu_bf16.available():  # the job read each model's own weights too
        assert floors[["C_t1 ÷ own read floor", "ideal at own read floors"]].notna().all().all()


def test_the_engines_sweep_runs_every_engine_with_its_baseline_in_one_job():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from specbench.app import CONF_DIR, to_config
    from specbench.bench.protocol import decoders

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        raw = compose("config", overrides=["+sweep=engines"], return_hydra_config=True)
    assert dict(raw.hydra.sweeper.params) == {"gamma": "4"}  # one job
    with open_dict(raw):
        del raw["hydra"]
    cfg = to_config(raw)
    assert (cfg.workload.kind, cfg.max_new_tokens, cfg.batch_size, cfg.threads) == ("spec_bench", 128, 1, 2)
    assert cfg.sampling.build().greedy and cfg.workload.limit_per_category == 1  # 13 prompts, one per category
    assert cfg.forward.path == "auto"  # the engines face specbench's fast path, not the eager reference
    names = decoders(cfg)
    assert set(names) == set(ENGINES.names())
    assert {ENGINES.get(n).baseline for n in names} <= set(names)

"""Inputs that must be refused, naming the parameter, before any model loads where that is possible
(issue 41, points 8 and 9): the API's arguments, prompts past the model's context, a batch larger than
the workload, a shape-only model given a source, a non-UTF-8 workload and workload errors."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import eager_cli

import specbench
from specbench.bench.workloads import WorkloadError, load_jsonl_prompts
from specbench.config import Config, DraftConfig, ModelConfig, PairConfig, WorkloadConfig

TINY_PAIR = dict(
    name="tiny", target=ModelConfig(source=None, shape="tiny-llama"), draft=ModelConfig(source=None), dtype="float32"
)


def _no_models(monkeypatch, module: str) -> None:
    def load_pair(*a, **k):
        raise AssertionError("models were loaded before the inputs were checked")

    monkeypatch.setattr(f"{module}.load_pair", load_pair)


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(gamma="abc"), TypeError, ["gamma='abc'", "integer >= 1"]),
        (dict(gamma=0), ValueError, ["gamma=0", "integer >= 1"]),
        (dict(max_new_tokens=0), ValueError, ["max_new_tokens=0"]),
        (dict(seed=1.5), TypeError, ["seed=1.5"]),
        (dict(prompts=[]), ValueError, ["prompts=[]", "at least one"]),
        (dict(prompts=[123]), TypeError, ["prompts[0]=123", "str"]),
        (dict(prompts=123), TypeError, ["prompts=123", "str"]),
        (dict(prompts=["hi", ""]), ValueError, ["prompts[1]=''", "empty"]),
    ],
)
def test_decode_names_the_bad_argument_before_loading(monkeypatch, kwargs, exc, words):
    _no_models(monkeypatch, "specbench.api")
    args = {"prompts": ["hello"], "draft": "ngram", "dtype": "float32", "forward": "eager", **kwargs}
    with pytest.raises(exc) as info:
        specbench.decode(**args)
    for word in words:
        assert word in str(info.value)


class _WordTokenizer:
    """One id per word: enough for the API to measure a prompt's length."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1 + len(w) % 7 for w in text.split()]}

    def batch_decode(self, tokens, skip_special_tokens=True):
        return [" ".join(map(str, t)) for t in tokens]


def test_decode_refuses_a_prompt_past_the_models_context(monkeypatch):
    from specbench.models.pair import Pair
    from specbench.models.shapes import build_shape_only_model

    model = build_shape_only_model("tiny-llama", dtype=__import__("torch").float32)
    context = model.config.max_position_embeddings
    pair = Pair(model, _WordTokenizer(), None, "ngram", set(), True, DraftConfig(kind="ngram"))
    monkeypatch.setattr("specbench.api.load_pair", lambda *a, **k: pair)
    long = " ".join(["word"] * (context - 4))
    with pytest.raises(ValueError) as info:
        specbench.decode([long], draft="ngram", dtype="float32", max_new_tokens=8, chat_template=False, forward="eager")
    message = str(info.value)
    assert f"{context - 4} tokens" in message and "max_new_tokens=8" in message and str(context) in message
    out = specbench.decode(
        ["a b c"], draft="ngram", dtype="float32", max_new_tokens=4, chat_template=False, forward="eager"
    )
    assert len(out.tokens[0]) == 4  # a prompt that fits runs


def test_cli_refuses_a_prompt_past_the_models_context(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    args = ["pair=tiny", "draft=ngram", "workload=synthetic", "workload.n_prompts=1", "workload.prompt_tokens=2045"]
    args += ["max_new_tokens=8", "warmup=0", "ct_bench=false", "report=false", f"runs_dir={tmp_path}"]
    result = subprocess.run(eager_cli(*args), capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 1, result.stderr[-2000:]
    said = result.stdout + result.stderr  # Hydra's job log goes to stdout
    assert "2045 tokens" in said and "max_new_tokens=8" in said and "context of 2048" in said
    (failure,) = tmp_path.rglob("failure.json")
    assert "2045 tokens" in json.loads(failure.read_text())["message"]
    assert not list(tmp_path.rglob("done.json"))


def test_batch_size_above_the_synthetic_prompt_count_is_refused():
    with pytest.raises(ValueError, match=r"batch_size=4: .*workload.n_prompts=2"):
        Config(
            pair=PairConfig(**TINY_PAIR),
            draft=DraftConfig(kind="ngram"),
            workload=WorkloadConfig(name="synthetic", kind="synthetic", n_prompts=2),
            batch_size=4,
        )


def _jsonl(tmp_path, lines: list[str], raw: bytes | None = None):
    path = tmp_path / "traffic.jsonl"
    if raw is not None:
        path.write_bytes(raw)
    else:
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _job(tmp_path, path, **kw) -> Config:
    return Config(  # a model with a tokenizer (never loaded: the workload is checked first)
        pair=PairConfig(name="mine", target=ModelConfig(source="some/model"), dtype="float32"),
        draft=DraftConfig(kind="ngram"),
        workload=WorkloadConfig(name="mine", kind="jsonl", path=str(path)),
        **kw,
    )


def test_batch_size_above_the_workloads_prompt_count_is_refused_before_loading(tmp_path, monkeypatch):
    from specbench.bench.job import run_job

    _no_models(monkeypatch, "specbench.bench.job")
    path = _jsonl(tmp_path, ['{"prompt": "one"}', '{"prompt": "two"}'])
    with pytest.raises(ValueError, match=r"batch_size=4: .*2 prompts"):
        run_job(_job(tmp_path, path, batch_size=4), tmp_path / "job")


def test_workload_errors_come_before_the_models_load(tmp_path, monkeypatch):
    from specbench.bench.job import run_job

    _no_models(monkeypatch, "specbench.bench.job")
    path = _jsonl(tmp_path, ['{"prompt": "one"}', '{"text": "two"}'])
    with pytest.raises(WorkloadError, match=r"traffic.jsonl:2: expected exactly one of the fields"):
        run_job(_job(tmp_path, path), tmp_path / "job")


def test_non_utf8_workload_names_the_file_and_line(tmp_path):
    path = _jsonl(tmp_path, [], raw=b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(WorkloadError, match=r"traffic.jsonl:2: not UTF-8"):
        load_jsonl_prompts(path)


@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_shape_only_model_given_a_source_is_refused(role):
    models = {"target": ModelConfig(source=None, shape="tiny-llama"), "draft": ModelConfig(source=None)}
    models[role] = ModelConfig(source="/nonexistent.gguf", shape="tiny-llama")
    with pytest.raises(ValueError, match=rf"pair.{role}.source='/nonexistent.gguf'.*pair.{role}.shape='tiny-llama'"):
        PairConfig(name="tiny", **models)


def test_pair_tiny_with_a_source_override_is_refused_on_the_command_line():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from specbench.app import CONF_DIR, to_config

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("config", overrides=["pair=tiny", "draft=ngram", "pair.target.source=/nonexistent.gguf"])
    with pytest.raises(ValueError, match="pair.target.source='/nonexistent.gguf'"):
        to_config(cfg)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(draft_policy="prune_naive"), ["draft.policy='prune_naive'", "not lossless"]),
        (dict(draft_policy="nope"), ["draft.policy='nope'", "must be one of"]),
        (dict(draft_tau=1.5), ["draft.tau=1.5", "[0, 1]"]),
    ],
)
def test_decode_names_a_bad_draft_policy_before_loading(monkeypatch, kwargs, words):
    _no_models(monkeypatch, "specbench.api")
    with pytest.raises(ValueError) as info:
        specbench.decode(["hello"], draft="ngram", dtype="float32", **kwargs)
    for word in words:
        assert word in str(info.value)


def test_decode_drafts_under_a_length_policy(monkeypatch):
    """Issue 38: `specbench.decode` drafted a fixed γ whatever was asked; `draft_policy` now reaches the decoder
    (a draft equal to the target at T = 1: confidence_stop at tau 0.99 stops on nearly every draft)."""
    from specbench.models.pair import Pair
    from specbench.models.shapes import build_shape_only_model

    model = build_shape_only_model("tiny-llama", dtype=__import__("torch").float32)
    cfg = DraftConfig(kind="model", policy="confidence_stop", tau=0.99)
    monkeypatch.setattr(
        "specbench.api.load_pair", lambda *a, **k: Pair(model, _WordTokenizer(), model, "model", set(), True, cfg)
    )
    out = specbench.decode(
        ["a b c"], draft="model", draft_model="same", dtype="float32", max_new_tokens=12, gamma=4, temperature=1.0,
        chat_template=False, draft_policy="confidence_stop", draft_tau=0.99,
    )  # fmt: skip
    spec = out.rounds[out.rounds["gamma"] > 0]
    assert len(out.tokens[0]) == 12 and "confidence" in set(spec["stop"])
    assert (spec["drafted"] <= spec["gamma"]).all() and spec["drafted"].min() < 4

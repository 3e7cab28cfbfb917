"""forward.path=auto's decision on given inputs, and the one KV-cache interface both LMs implement."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from transformers import LlamaConfig

import specbench
from specbench.config import ForwardConfig
from specbench.decoding.forward import ForwardPath
from specbench.decoding.forward_choice import ForwardChoice, choose, choose_for, compiler_refusal, fast_path_refusal
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.lm import LM
from specbench.decoding.static_kv import StaticLM

NO_CXX = "no C++ compiler 'g++' on PATH"
CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize(
    ("device", "compiler", "expected"),
    [
        ("cpu", None, ("compiled", "max-autotune")),
        ("cpu", NO_CXX, ("eager", "max-autotune")),
        ("cuda", None, ("compiled", "reduce-overhead")),
        ("cuda:1", NO_CXX, ("compiled", "reduce-overhead")),  # CUDA graphs need no host compiler
        ("mps", None, ("eager", "max-autotune")),
    ],
)
def test_auto_is_compiled_where_supported_else_eager_with_the_reason(device, compiler, expected):
    chosen = choose("auto", "max-autotune", device, None, compiler)
    assert (chosen.path, chosen.compile_mode) == expected
    assert chosen.reason.startswith(f"auto: {expected[0]}")
    if compiler and device == "cpu":
        assert NO_CXX in chosen.reason


def test_auto_on_a_model_the_fast_path_refuses_runs_eager_saying_why():
    refusal = "model config _attn_implementation='flash_attention_2': the fast path needs one of ['sdpa', 'eager']"
    chosen = choose("auto", "default", "cuda", refusal, None)
    assert chosen.path == "eager" and refusal in chosen.reason


@pytest.mark.parametrize("path", ["compiled", "static"])
def test_a_named_fast_path_on_a_refused_model_stops_naming_the_reason(path):
    with pytest.raises(ValueError, match=rf"forward.path='{path}': model config _attn_implementation='flex'"):
        choose(path, "default", "cpu", "model config _attn_implementation='flex': ...", None)


def test_named_paths_run_as_asked_with_no_reason():
    for path in ("eager", "static", "compiled"):
        assert choose(path, "default", "cpu", None, NO_CXX) == ForwardChoice(path, "default", "")
    assert choose("eager", "default", "cpu", "refused", None).path == "eager"  # the reference runs anything


def test_fast_path_refusal_reads_the_attention_implementation():
    cfg = LlamaConfig(num_hidden_layers=1)
    for impl, refused in (("sdpa", False), ("eager", False), ("flash_attention_2", True)):
        cfg._attn_implementation = impl
        assert (fast_path_refusal(cfg) is not None) == refused


def test_this_machine_has_a_compiler_so_auto_compiles_here(target):
    assert compiler_refusal() is None  # the suite runs compiled tests: g++ is there
    assert choose_for("auto", "default", "cpu", target.config).path == "compiled"


def test_the_fast_path_is_the_default_and_auto_must_be_resolved():
    # A cold compile fits the default sweep (analysis/gamma_sweep_fast_path_cpu_amx/).
    assert ForwardConfig().path == "auto"
    assert inspect.signature(specbench.decode).parameters["forward"].default == "auto"
    assert OmegaConf.load(CONF / "config.yaml").defaults[5] == {"forward": "auto"}
    with pytest.raises(ValueError, match="resolve auto first"):
        ForwardPath("auto")


def test_both_kv_caches_implement_the_lm_protocol(target):
    assert isinstance(CachedLM(target), LM)
    assert isinstance(StaticLM(target, 64), LM)
    for name in ("prefill", "prefill_from", "feed", "uncache_last", "keep_last_fed", "select_rows", "row_kv_bytes"):
        assert callable(getattr(StaticLM, name)) and callable(getattr(CachedLM, name))

"""Shape-only models: presets, config.json loading, deterministic random builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specbench.models import shapes


def _n_params(name: str) -> int:
    model = shapes.build_shape_only_model(name, dtype=torch.bfloat16, device="meta")
    assert all(p.is_meta for p in model.parameters())  # nothing materialised
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "name, expected",
    [("llama-3.1-8b", 8.03e9), ("llama-3.2-1b", 1.236e9), ("qwen2.5-7b", 7.62e9), ("qwen2.5-0.5b", 0.494e9)],
)
def test_preset_parameter_counts(name: str, expected: float) -> None:
    assert _n_params(name) == pytest.approx(expected, rel=0.005)


def test_tiny_llama_forward_on_cpu() -> None:
    default = torch.get_default_dtype()
    model = shapes.build_shape_only_model("tiny-llama", dtype="bfloat16", device="cpu", seed=0)
    assert torch.get_default_dtype() == default  # no leaked bf16 default
    assert model.config.specbench_shape_only is True
    assert not model.training
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out = model(input_ids=ids)
    assert out.logits.shape == (2, 9, 512)
    assert torch.isfinite(out.logits.float()).all()


def test_build_is_deterministic() -> None:
    cfg = shapes.shape_config("tiny-llama")
    a = shapes.build_shape_only_model(cfg, dtype=torch.float32, seed=1).state_dict()
    b = shapes.build_shape_only_model(cfg, dtype=torch.float32, seed=1).state_dict()
    c = shapes.build_shape_only_model(cfg, dtype=torch.float32, seed=2).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert not hasattr(cfg, "specbench_shape_only")  # the caller's config is not mutated


def test_shape_config_from_json(tmp_path: Path) -> None:
    d = dict(shapes.PRESETS["tiny-llama"], num_hidden_layers=3, hidden_size=32)
    (tmp_path / "config.json").write_text(json.dumps(d))
    for src in (tmp_path, tmp_path / "config.json", str(tmp_path)):
        cfg = shapes.shape_config(src)
        assert cfg.model_type == "llama" and cfg.num_hidden_layers == 3 and cfg.hidden_size == 32
        assert cfg.specbench_shape.endswith("config.json")
    model = shapes.build_shape_only_model(shapes.shape_config(tmp_path, num_hidden_layers=1), dtype="float32")
    assert len(model.model.layers) == 1
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ValueError, match="model_type"):
        shapes.shape_config(tmp_path / "bad")


def test_overrides_and_errors() -> None:
    cfg = shapes.shape_config("llama-3.1-8b", num_hidden_layers=2, rope_theta=10000.0)
    assert cfg.num_hidden_layers == 2 and cfg.hidden_size == 4096
    assert cfg.specbench_shape == "llama-3.1-8b"
    with pytest.raises(ValueError, match="num_hidden_layers"):
        shapes.shape_config("llama-3.1-8b", num_layers=2)  # typo names the right field
    with pytest.raises(ValueError, match="tiny-llama"):
        shapes.shape_config("llama-9000")  # unknown: lists the presets
    with pytest.raises(ValueError, match="floating"):
        shapes.build_shape_only_model("tiny-llama", dtype="int8")
    # the presets themselves are not mutated by overrides
    assert shapes.PRESETS["llama-3.1-8b"]["num_hidden_layers"] == 32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_build_directly_on_gpu() -> None:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()  # what earlier tests in the process still hold counts in the peak
    cfg = shapes.shape_config("llama-3.2-1b", num_hidden_layers=4)
    model = shapes.build_shape_only_model(cfg, dtype=torch.bfloat16, device="cuda", seed=0)
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert {p.device.type for p in model.parameters()} == {"cuda"}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    # built in bf16 on the GPU: peak is about the bf16 size, never an fp32 copy (2x)
    assert torch.cuda.max_memory_allocated() - before < 2 * n_bytes  # H200: 1.52x (one embedding-sized temporary)
    ids = torch.randint(0, cfg.vocab_size, (2, 16), device="cuda")
    with torch.inference_mode():
        assert model(input_ids=ids).logits.shape == (2, 16, cfg.vocab_size)

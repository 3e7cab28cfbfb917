"""bf16 linears on CPU (`specbench.models.kernels`): the tuned kernels give torch's results, the swap keeps
parameters, copies, quantized copies and compiled traces working, and is refused where it does not apply."""

from __future__ import annotations

import copy
import json
import os
import subprocess

import pandas as pd
import pytest
import torch
from conftest import eager_cli, tiny_llama
from torch import nn

from specbench.config import PairConfig
from specbench.models import kernels
from specbench.models.kernels import (
    CpuLinear,
    aten_gemv,
    gemv_rows,
    linear_kernels,
    prepack_supported,
    tune_cpu_linears,
)
from specbench.models.quant import Int8Linear, quantize_w8a16

needs_prepack = pytest.mark.skipif(not prepack_supported(), reason="oneDNN's bf16 prepacking needs AVX-512 here")


def bf16_linear(out_features: int = 96, in_features: int = 64, bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(in_features, out_features, bias=bias, dtype=torch.bfloat16)


@needs_prepack
def test_each_kernel_gives_torchs_result():
    """Past `gemv_rows` the prepacked kernel equals F.linear bit for bit; up to it, ATen's gemv, which sums
    in another order, so it may differ in the last bf16 bit only."""
    linear = bf16_linear()
    layer = CpuLinear(linear, gemv_rows=2)
    with torch.inference_mode():
        for rows in (1, 2):
            x = torch.randn(rows, 64, dtype=torch.bfloat16)
            y = layer(x)
            assert torch.equal(y, aten_gemv(x, linear.weight, linear.bias))
            torch.testing.assert_close(y, nn.functional.linear(x, linear.weight, linear.bias))
        x = torch.randn(2, 3, 64, dtype=torch.bfloat16)  # 6 rows, with a leading batch dim
        assert torch.equal(layer(x), nn.functional.linear(x, linear.weight, linear.bias))
        assert layer.packed is not None


def test_tuned_model_matches_torch_and_keeps_its_parameters():
    """The swap keeps the very Parameters (a tied head stays tied), and the tuned model's logits are
    torch's: exactly past one row (prefill), to bf16 rounding at one row."""
    model = tiny_llama(0, dtype=torch.bfloat16)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's head is
    reference = copy.deepcopy(model)
    params = {id(p) for p in model.parameters()}
    choices = tune_cpu_linears(model)
    assert set(choices) == {"bf16 32x32", "bf16 16x32", "bf16 64x32", "bf16 32x64", "bf16 96x32"}
    assert all(rows in (0, *kernels.PROBE_ROWS) for rows in choices.values())
    assert {id(p) for p in model.parameters()} == params
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert sum(isinstance(m, CpuLinear) for m in model.modules()) == 2 * 7 + 1
    ids = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        many, one = model(ids).logits, model(ids[:, :1]).logits
        ref_many, ref_one = reference(ids).logits, reference(ids[:, :1]).logits
    if prepack_supported() and all(rows < 9 for rows in choices.values()):
        assert torch.equal(many, ref_many)
    torch.testing.assert_close(many, ref_many, atol=0.1, rtol=0.02)
    torch.testing.assert_close(one, ref_one, atol=0.1, rtol=0.02)


def test_tuned_model_copies_quantizes_and_compiles():
    """A deep copy works (the opaque prepacked copy is left out and remade on use), W8A16 still replaces
    every linear, and a torch.compile trace sees plain linears (inductor prepacks on its own)."""
    model = tiny_llama(0, dtype=torch.bfloat16)
    tune_cpu_linears(model)
    twin = copy.deepcopy(model)
    assert all(m.packed is None for m in twin.modules() if isinstance(m, CpuLinear))
    ids = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        assert torch.equal(twin(ids).logits, model(ids).logits)
    quantized = quantize_w8a16(model)
    assert not any(isinstance(m, CpuLinear) for m in quantized.modules())
    assert sum(isinstance(m, Int8Linear) for m in quantized.modules()) == 2 * 7 + 1

    traced_ops = []

    def record(gm, example_inputs):
        traced_ops.extend(str(node.target) for node in gm.graph.nodes)
        return gm.forward

    layer = model.model.layers[0].mlp.up_proj
    layer.own_counts = ()  # specbench's kernel stays in a trace (tests/test_cpu_bf16.py); here torch's linear does
    with torch.inference_mode():
        x = torch.randn(3, 32, dtype=torch.bfloat16)
        y = torch.compile(layer, backend=record, fullgraph=True)(x)
        assert torch.equal(y, nn.functional.linear(x, layer.weight))
    assert any("linear" in op for op in traced_ops) and not any("mkldnn" in op for op in traced_ops)


def test_tuning_applies_to_bf16_on_cpu_within_memory_only(monkeypatch):
    """Other dtypes keep nn.Linear, and so does a model whose prepacked copies would crowd memory."""
    fp32 = tiny_llama(0, dtype=torch.float32)
    assert tune_cpu_linears(fp32) == {} and linear_kernels(fp32) == {}
    monkeypatch.setattr(kernels, "physical_memory", lambda: 1 << 16)  # a 64 KiB machine
    bf16 = tiny_llama(0, dtype=torch.bfloat16)
    assert tune_cpu_linears(bf16) == {}
    assert not any(isinstance(m, CpuLinear) for m in bf16.modules())


def test_upcast_is_the_float32_product_of_the_bf16_values_rounded_once():
    linear = bf16_linear()
    layer, x = CpuLinear(linear), torch.randn(5, 64, dtype=torch.bfloat16)
    want = nn.functional.linear(x.double(), linear.weight.double(), linear.bias.double())
    got = layer.upcast(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, nn.functional.linear(x.float(), linear.weight.float(), linear.bias.float()).bfloat16())
    torch.testing.assert_close(got.double(), want, rtol=2**-8, atol=1e-6)


def test_rows_past_the_gemv_take_the_upcast_only_where_it_was_chosen_and_onednn_cannot_prepack(monkeypatch):
    """Past `gemv_rows` (and `own_counts`): oneDNN's prepacked kernel where it can prepack; else, from
    `UPCAST_MIN_ROWS` rows, the upcast where `upcast_wide` chose it; else torch's bf16 linear. A decode step or a
    verify never widens the weight, even with no gemv or own rows (no C++ compiler, SPECBENCH_CPU_MATVEC=0)."""
    calls = []
    monkeypatch.setattr(CpuLinear, "upcast", lambda self, x: calls.append(x.shape[0]) or self.torch_default(x))
    layer = CpuLinear(bf16_linear(), gemv_rows=0)
    rows = (1, 8, kernels.UPCAST_MIN_ROWS - 1, kernels.UPCAST_MIN_ROWS, 64)
    with torch.inference_mode():
        for can_prepack, chosen, expected in (
            (False, True, [kernels.UPCAST_MIN_ROWS, 64]),
            (False, False, []),
            (True, True, []),
        ):
            if can_prepack and not prepack_supported():
                continue
            calls.clear()
            layer.can_prepack, layer.upcast_wide = can_prepack, chosen
            for n in rows:
                assert layer(torch.randn(n, 64, dtype=torch.bfloat16)).shape == (n, 96)
            assert calls == expected, (can_prepack, chosen)


def test_tuning_sets_the_upcast_choice_only_where_onednn_cannot_prepack_and_copies_keep_it(monkeypatch):
    asked, prepacks_here = [], prepack_supported()
    monkeypatch.setattr(kernels, "gemv_rows", lambda *shape: 0)
    monkeypatch.setattr(kernels, "own_row_counts", lambda *shape: ())
    monkeypatch.setattr(kernels, "upcast_wide", lambda *shape: asked.append(shape) or True)
    monkeypatch.setattr(kernels, "prepack_supported", lambda: False)
    model = tiny_llama(0, dtype=torch.bfloat16)
    tune_cpu_linears(model)
    layers = [m for m in copy.deepcopy(model).modules() if isinstance(m, CpuLinear)]
    assert layers and all(m.upcast_wide for m in layers) and len(asked) == len(layers)
    if prepacks_here:  # where oneDNN prepacks bf16 the upcast is neither timed nor taken
        monkeypatch.setattr(kernels, "prepack_supported", lambda: True)
        asked.clear()
        model = tiny_llama(0, dtype=torch.bfloat16)
        tune_cpu_linears(model)
        assert not asked and not any(m.upcast_wide for m in model.modules() if isinstance(m, CpuLinear))


def test_the_wide_rule_widens_only_when_clearly_faster():
    assert kernels.pick_wide({"upcast": 1.0, "torch": 4.0})
    assert not kernels.pick_wide({"upcast": 0.95, "torch": 1.0})  # a near-tie keeps torch's kernel
    assert not kernels.pick_wide({"upcast": 3.0, "torch": 1.0})


def test_the_dtype_probe_times_the_prompt_rows_in_the_upcast_only_where_a_job_could_run_it(monkeypatch):
    from specbench.models import loading

    linears = [bf16_linear()]
    monkeypatch.setattr(loading, "prepack_supported", lambda: False)
    assert set(loading.prefill_kernels("bfloat16", linears)) == {"torch", "upcast"}
    assert set(loading.prefill_kernels("bfloat16", linears, cpu_linear="torch")) == {"torch"}
    assert set(loading.prefill_kernels("float32", linears)) == {"torch"}
    monkeypatch.setattr(loading, "prepack_supported", lambda: True)
    assert set(loading.prefill_kernels("bfloat16", linears)) == {"torch"}


def test_the_dtype_probe_counts_the_upcast_only_where_a_job_would_take_it(monkeypatch):
    """A prefill the upcast runs within a near-tie of torch's is charged at torch's time, as a job runs it."""
    from specbench.models import loading

    def medians(upcast: float):
        def timed(runs, repeats):
            return {key: {"torch": 1.0, "upcast": upcast}.get(key[2], 1.0) for key in runs}

        return timed

    monkeypatch.setattr(loading, "prepack_supported", lambda: False)
    for upcast, charged in ((0.95, 1.0), (0.5, 0.5)):
        monkeypatch.setattr(loading, "interleaved_medians", medians(upcast))
        seconds = loading.time_cpu_dtypes(repeats=1)
        assert seconds["bfloat16"]["prefill"] == pytest.approx(
            charged * (loading.PROBE_GAMMA + 1) / loading.PROBE_PREFILL_ROWS
        )


def test_gemv_rows_is_a_probed_row_count():
    assert gemv_rows(96, 64, prepack_supported(), 1 << 20) in (0, *kernels.PROBE_ROWS)


def test_bad_cpu_linear_names_the_field():
    with pytest.raises(ValueError, match=r"pair.cpu_linear='fast'.*tuned.*torch"):
        PairConfig(cpu_linear="fast")


@pytest.mark.parametrize("setting", ["tuned", "torch"])
def test_job_records_the_linear_kernels_and_labels_rows(setting, tmp_path):
    """A real Hydra job on a bf16 pair: done.json has the per-shape choice, and rows of the torch setting
    carry their own `forward` key, so the cost model never pools their timings with the tuned ones."""
    args = ["pair=tiny", "pair.dtype=bfloat16", f"pair.cpu_linear={setting}", "draft=model", "workload=synthetic"]
    args += ["report=false", "max_new_tokens=6", "workload.n_prompts=2", "sweep_name=k", f"runs_dir={tmp_path}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(eager_cli(*args), capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    (job,) = tmp_path.glob("k/*")
    record = json.loads((job / "done.json").read_text())["cpu_linear"]
    assert record["setting"] == setting
    if setting == "tuned":
        assert record["target_gemv_rows"] and record["draft_gemv_rows"]
        assert all(rows in (0, *kernels.PROBE_ROWS) for rows in record["target_gemv_rows"].values())
    else:
        assert record["target_gemv_rows"] == record["draft_gemv_rows"] == {}
    label = "eager" if setting == "tuned" else "eager+torch_linear"
    for table in ("requests", "rounds", "ct"):
        assert set(pd.read_parquet(job / f"{table}.parquet").forward) == {label}, table

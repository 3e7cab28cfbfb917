"""The hardware floor: weight bytes a decode step reads, the streaming probe, and the report's ratios."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from conftest import tiny_llama
from synthetic import synthetic_sweep

from specbench.analysis.floor import bandwidth_spread, hardware_limit
from specbench.bench.microbench import FLOOR_COLUMNS, bench_weight_stream, streamed_weight_bytes, streamed_weights
from specbench.models import cpu_bf16
from specbench.models.quant import quantize_w8a16
from specbench.report import build_report

# tiny_llama: vocab 96, hidden 32, intermediate 64, 2 layers, 4 heads of 8, 2 KV heads.
_LAYER = 32 * 32 * 2 + 32 * 16 * 2 + 32 * 64 * 3 + 32 * 2  # q, o; k, v; gate, up, down; two norms
_HEAD = 96 * 32


def test_weight_bytes_count_what_a_decode_step_reads():
    untied = tiny_llama(0)  # float64: 8 bytes per element
    rotary = sum(b.numel() * b.element_size() for b in untied.buffers())  # inv_freq: read too, a few bytes
    # The input embedding is a lookup (one row per token), so only the head is streamed.
    assert streamed_weight_bytes(untied) == 8 * (2 * _LAYER + 32 + _HEAD) + rotary
    tied = tiny_llama(0)
    tied.lm_head.weight = tied.model.embed_tokens.weight
    assert streamed_weight_bytes(tied) == 8 * (2 * _LAYER + 32 + _HEAD) + rotary  # the shared matrix once
    # W8A16: int8 weights plus one scale per output channel (the model's dtype); norms stay float64.
    q = quantize_w8a16(tiny_llama(0))
    linear_weights = 2 * (32 * 32 * 2 + 32 * 16 * 2 + 32 * 64 * 3) + _HEAD
    scales = 2 * (32 * 2 + 16 * 2 + 64 * 2 + 32) + 96
    assert streamed_weight_bytes(q) == linear_weights + 8 * scales + 8 * (2 * 64 + 32) + rotary
    assert streamed_weight_bytes(None) == 0  # n-gram lookup reads no weights


def test_stream_probe_rows():
    rows = bench_weight_stream(torch.float32, "cpu", probe_bytes=8 << 20, repeats=3)
    assert [(r["probe"], r["repeat"]) for r in rows] == [(p, i) for p in ("matvec", "read") for i in range(3)]
    assert all(r["probe_bytes"] == 8 << 20 and r["t_stream"] > 0 for r in rows)
    assert {r["threads"] for r in rows} == {torch.get_num_threads()}
    probes = {r["probe"] for r in bench_weight_stream(torch.bfloat16, "cpu", probe_bytes=1 << 20, repeats=1)}
    assert probes == ({"matvec", "read", "kernel"} if cpu_bf16.available() else {"matvec", "read"})


@pytest.mark.skipif(not cpu_bf16.available(), reason="the own-weights read runs on specbench's CPU kernels")
def test_stream_probe_reads_each_models_own_weights():
    """`read_<name>` reads the tensors a step streams where they lie: its bytes are the model's streamed bytes."""
    target, draft = tiny_llama(0), quantize_w8a16(tiny_llama(0))
    assert sum(t.numel() * t.element_size() for t in streamed_weights(target)) == streamed_weight_bytes(target)
    assert streamed_weights(None) == []
    weights = {"target": streamed_weights(target), "draft": streamed_weights(draft), "none": []}
    rows = bench_weight_stream(torch.float32, "cpu", probe_bytes=1 << 20, repeats=2, weights=weights)
    by_probe = {}
    for r in rows:
        by_probe.setdefault(r["probe"], []).append(r)
    assert list(by_probe) == ["matvec", "read", "read_target", "read_draft"]  # no tensors, no probe
    words = lambda model: sum(t.numel() * t.element_size() // 4 * 4 for t in streamed_weights(model))
    assert {r["probe_bytes"] for r in by_probe["read_target"]} == {words(target)}
    assert {r["probe_bytes"] for r in by_probe["read_draft"]} == {words(draft)}
    assert {r["probe_bytes"] for r in by_probe["read"]} == {1 << 20}
    assert all(len(v) == 2 and all(r["t_stream"] > 0 for r in v) for v in by_probe.values())


def _timing(**extra) -> pd.DataFrame:
    keys = {"hardware": "cpu:x", "dtype": "bfloat16", "target": "t", "draft": "d", "batch_size": 1}
    return pd.DataFrame([{**keys, "ct1": 0.040, "cd_per_token": 0.024, **extra}])


def _floor(draft_bytes: int = 135_000_000) -> pd.DataFrame:
    keys = {"hardware": "cpu:x", "dtype": "bfloat16", "target": "t", "draft": "d"}
    # matvec: 270 MB in 27, 18 and 20 ms: 10, 15 and 13.5 GB/s, median 13.5 GB/s; read: 27 GB/s at best
    # (13.5 and 27: median 20.25); kernel: 18 GB/s.
    rows = [("matvec", 270_000_000, i, t, 2, 270_000_000, draft_bytes) for i, t in enumerate((0.027, 0.018, 0.020))]
    rows += [("read", 270_000_000, i, t, 2, 270_000_000, draft_bytes) for i, t in enumerate((0.020, 0.010))]
    rows += [("kernel", 270_000_000, 0, 0.015, 2, 270_000_000, draft_bytes)]
    # each model's own weights where they lie: the target's 270 MB at 15 and 18 GB/s (best 18), the draft's at 27
    rows += [("read_target", 270_000_000, i, t, 2, 270_000_000, draft_bytes) for i, t in enumerate((0.018, 0.015))]
    if draft_bytes:
        rows += [("read_draft", draft_bytes, 0, draft_bytes / 27e9, 2, 270_000_000, draft_bytes)]
    return pd.DataFrame(rows, columns=FLOOR_COLUMNS).assign(**keys)


def test_hardware_limit_hand_values():
    hl = hardware_limit(_timing(), _floor())
    (row,) = hl.to_dict("records")
    assert math.isclose(row["bandwidth"], 13.5e9)
    assert math.isclose(row["target_floor"], 0.020)  # 270 MB / 13.5 GB/s
    assert math.isclose(row["draft_floor"], 0.010)
    assert math.isclose(row["ct1_over_floor"], 2.0)
    assert math.isclose(row["cd_over_floor"], 2.4)
    assert math.isclose(row["read_bandwidth"], 27e9) and math.isclose(row["target_floor_read"], 0.010)
    assert math.isclose(row["ct1_over_floor_read"], 4.0) and math.isclose(row["cd_over_floor_read"], 4.8)
    assert math.isclose(row["read_bandwidth_median"], 20.25e9)  # the floor takes the best read, not the median
    assert math.isclose(row["ct1_floor_share_read"], 0.25) and math.isclose(row["ct1_floor_share"], 0.5)
    assert math.isclose(row["kernel_bandwidth"], 18e9) and math.isclose(row["ct1_over_floor_kernel"], 0.040 / 0.015)
    assert math.isclose(row["own_target_bandwidth"], 18e9) and math.isclose(row["target_floor_own"], 0.015)
    assert math.isclose(row["ct1_over_floor_own"], 0.040 / 0.015) and math.isclose(row["own_draft_bandwidth"], 27e9)
    assert math.isclose(row["draft_floor_own"], 0.005) and math.isclose(row["cd_over_floor_own"], 4.8)
    assert math.isclose(row["cd_floor_share_own"], 1 / 4.8)
    spread = bandwidth_spread(_floor()).set_index("probe")
    assert spread.loc["read", "n"] == 2 and math.isclose(spread.loc["read", "bw_min"], 13.5e9)
    assert math.isclose(spread.loc["read", "bw_max"], 27e9) and spread.loc["read", "threads"] == 2
    old = hardware_limit(_timing(), _floor().query("probe == 'matvec'").drop(columns=["probe", "threads"])).iloc[0]
    assert math.isclose(old["ct1_over_floor"], 2.0) and math.isnan(old["ct1_over_floor_read"])  # runs before the probe
    assert math.isnan(old["ct1_over_floor_kernel"]) and math.isnan(old["ct1_over_floor_own"])
    ngram = hardware_limit(_timing(), _floor(draft_bytes=0)).iloc[0]
    assert math.isnan(ngram["draft_floor"]) and math.isnan(ngram["cd_over_floor"])  # no weights, no floor
    assert hardware_limit(_timing(), None).empty
    assert hardware_limit(_timing(hardware="cpu:other"), _floor()).empty  # floors never cross machines


def test_report_shows_the_hardware_limit(tmp_path):
    s = synthetic_sweep(gammas=(1, 2), alphas={"chat": (0.8, 0.7)}, n_prompts=3, new_tokens=24, seed=5)
    keys = s["rounds"][["hardware", "dtype", "target", "draft"]].drop_duplicates()
    floor = pd.concat([_floor().drop(columns=list(keys.columns)).assign(**k) for k in keys.to_dict("records")])
    res = build_report(s["rounds"], s["requests"], s["ct"], tmp_path, floor=floor)
    md = res["markdown"].read_text()
    assert "Hardware limit" in md and "C_t1 ÷ floor" in md and "C_t1 ÷ own read floor" in md
    table = pd.read_csv(tmp_path / "tables" / "hardware_limit.csv")
    assert (table["bandwidth"] == 13.5e9).all()
    plain = build_report(s["rounds"], s["requests"], s["ct"], tmp_path / "plain")
    assert "C_t1 ÷ floor" not in plain["markdown"].read_text()


def test_engines_floor_table_counts_no_draft_floor_where_the_draft_probe_is_missing():
    """The engines section's ideal at the own read floors: a draft with weights but no `read_draft` row has no such
    floor (NaN), not a free draft; an n-gram draft (no weights) is free."""
    from specbench.report.engines_view import floor_table

    rounds = synthetic_sweep(gammas=(2,), alphas={"chat": (0.8, 0.7)}, n_prompts=3, new_tokens=24, seed=5)["rounds"]
    keys = rounds[["hardware", "dtype", "target", "draft"]].drop_duplicates().iloc[0].to_dict()
    timing = _timing(**keys)
    floor = _floor().assign(**keys)
    full = floor_table(rounds, hardware_limit(timing, floor), pd.DataFrame()).iloc[0]
    assert math.isfinite(full["ideal at own read floors"]) and math.isfinite(full["C_d ÷ own read floor"])
    no_draft_probe = hardware_limit(timing, floor.query("probe != 'read_draft'"))
    row = floor_table(rounds, no_draft_probe, pd.DataFrame()).iloc[0]
    assert math.isnan(row["ideal at own read floors"]) and math.isnan(row["C_d ÷ own read floor"])
    assert math.isfinite(row["ideal at read floors"])  # the other floors stand
    ngram = floor_table(rounds, hardware_limit(timing, _floor(draft_bytes=0).assign(**keys)), pd.DataFrame()).iloc[0]
    assert math.isfinite(ngram["ideal at own read floors"])  # no weights: the draft costs no floor


def test_break_even_draft_cost_solves_the_round_for_c_d():
    """At C_d = break-even the cost model's own speedup (`speedup_formula`, the plain step as its C_t1) is 1, on the
    EPYC AVX2 job's figures (avx2_break_even: E[N] 5.316, plain step 11.713 ms, C_t(6) 17.075 ms, C_o 1.269 ms,
    d = 5); 0 where the verify alone costs more than the tokens it yields; NaN where no round drafted."""
    from specbench.analysis.speedup import break_even_draft_cost, speedup_formula

    costs = {"accept_length": 5.316, "ct1": 11.713e-3, "ct": 17.075e-3, "co": 1.269e-3, "drafted": 5.0}
    tie = break_even_draft_cost(**costs)
    assert math.isclose(tie, 8.785e-3, rel_tol=1e-3)  # the job's report
    assert math.isclose(speedup_formula(5.316, 11.713e-3, 5 * tie, 17.075e-3, 1.269e-3), 1.0)
    assert break_even_draft_cost(**{**costs, "accept_length": 1.5}) == 0.0
    assert math.isnan(break_even_draft_cost(**{**costs, "drafted": 0.0}))


@pytest.mark.parametrize("batch_size", [1, 2])
def test_engines_floor_table_gives_the_break_even_draft_cost(batch_size):
    """Each speculative engine's row, batch rows or not: at its break-even C_d its rounds' time per token equals the
    plain step's (`speedup_formula` = 1 on the row's E[N], d, C_t(d+1) and C_o); C_o and the plain step are the
    means per round of the engine's `t_overhead` and the baseline's `t_round`; in the report in ms; no draft cost
    pays for a verify 100x as long."""
    from specbench.analysis.rows import round_level
    from specbench.analysis.speedup import speedup_formula
    from specbench.report.engines_view import _ms, floor_table

    sweep = synthetic_sweep(
        gammas=(2,), alphas={"chat": (0.8, 0.7)}, batch_sizes=(batch_size,), n_prompts=4, new_tokens=24, seed=5
    )
    rounds = sweep["rounds"]
    keys = rounds[["hardware", "dtype", "target", "draft"]].drop_duplicates().iloc[0].to_dict()
    limit = hardware_limit(_timing(**keys), _floor().assign(**keys))
    table = floor_table(rounds, limit, pd.DataFrame())
    row = table.iloc[0]
    per_round = round_level(rounds)
    assert math.isclose(row["C_o"], per_round[per_round["gamma"] > 0]["t_overhead"].mean())
    assert math.isclose(row["plain step"], per_round[per_round["gamma"] == 0]["t_round"].mean())
    d, tie = row["drafted per round"], row["C_d at break-even"]
    assert tie > 0 and math.isclose(
        speedup_formula(row["E[N]"], row["plain step"], d * tie, row["C_t(d+1)"], row["C_o"]), 1
    )
    assert math.isclose(row["C_d ÷ break-even"], row["C_d per token"] / tie)
    assert math.isclose(_ms(table).iloc[0]["C_d at break-even ms"], 1e3 * tie)
    slow = rounds.assign(t_verify=rounds["t_verify"].where(rounds["gamma"] == 0, rounds["t_verify"] * 100))
    row = floor_table(slow, limit, pd.DataFrame()).iloc[0]
    assert row["C_d at break-even"] == 0.0 and math.isnan(row["C_d ÷ break-even"])


def test_engines_section_sets_llama_cpps_plain_step_beside_the_target_floors():
    """The demonstrated floor: llama.cpp's llama-bench C_t1 (30 ms) over specbench's target floors on the same
    hardware and target (matvec 20 ms, read 10 ms, own read 15 ms), and specbench's C_t1 (40 ms) against it; a
    llama.cpp row of another machine gets no row."""
    from specbench.report.engines_view import demonstrated_floor

    hl = hardware_limit(_timing(), _floor())
    llama = {"dtype": "gguf:F16", "draft": "gguf:Q4_1", "ct_source": "llama-bench", "ct1": 0.030}
    timing = pd.concat(
        [_timing(ct_source="ct"), _timing(**llama), _timing(**llama | {"hardware": "cpu:other"})], ignore_index=True
    )
    rows = demonstrated_floor(timing, hl)
    assert len(rows) == 1 and rows.iloc[0]["hardware"] == "cpu:x"
    row = rows.iloc[0]
    assert math.isclose(row["llama.cpp C_t1 ÷ matvec floor"], 1.5) and math.isclose(
        row["llama.cpp C_t1 ÷ read floor"], 3.0
    )
    assert math.isclose(row["llama.cpp C_t1 ÷ own read floor"], 2.0)
    assert math.isclose(row["C_t1 ÷ llama.cpp C_t1"], 0.040 / 0.030)
    assert demonstrated_floor(_timing(ct_source="ct"), hl).empty  # no llama.cpp in the sweep

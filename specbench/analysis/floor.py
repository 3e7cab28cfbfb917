"""The hardware limit: each measured cost beside the floor the machine's memory bandwidth sets for it.

A decode step reads every weight once, so weight bytes ÷ the measured streaming bandwidth is the least
a step can cost; a cost far above it is overhead- or kernel-bound, not memory-bound.
"""

from __future__ import annotations

import pandas as pd

FLOOR_KEYS = ("hardware", "dtype", "target", "draft")  # what a floor row is specific to (not the batch size)


def bandwidth_spread(floor: pd.DataFrame) -> pd.DataFrame:
    """Per floor setting (`FLOOR_KEYS`) and probe: n repeats, min / median / max bandwidth in bytes/s, and the
    threads the probe ran on (where recorded). The spread says how much a busy machine moved the probe."""
    if floor is None or floor.empty:
        return pd.DataFrame()
    floor = floor if "probe" in floor.columns else floor.assign(probe="matvec")  # runs before the read probe
    keys = [k for k in FLOOR_KEYS if k in floor.columns]
    rates = floor.assign(bandwidth=floor["probe_bytes"] / floor["t_stream"])
    agg = {"n": ("bandwidth", "size"), "bw_min": ("bandwidth", "min"), "bw_median": ("bandwidth", "median")}
    agg["bw_max"] = ("bandwidth", "max")
    if "threads" in rates.columns:
        agg["threads"] = ("threads", "max")
    return rates.groupby([*keys, "probe"], dropna=False).agg(**agg).reset_index()


def hardware_limit(timing: pd.DataFrame, floor: pd.DataFrame | None) -> pd.DataFrame:
    """How far each measured cost is from the hardware: per timing setting (a `timing_table` row),
    C_t1 and C_d per drafted token beside their floors, weight bytes ÷ a streaming bandwidth of the job's
    probes (`specbench.bench.microbench.bench_weight_stream`), in seconds.

    Floors: `read` (a plain sum over the bytes on all threads: what the memory delivers at all) at the BEST
    repeat, the hardware limit (`*_read` columns; `read_bandwidth_median` beside it; NaN for rows of older
    runs that lack the probe); `matvec` (the library's own k = 1 linear, median: what a step could reach
    with that kernel; `target_floor`, `ct1_over_floor`, ...); `kernel` (specbench's bf16 one-row kernel,
    median; `*_kernel`, NaN where not run); `own` (the read probe over each model's own weights where they lie, at
    the best repeat: the target's floor at `read_target`'s rate, the draft's at `read_draft`'s; `*_own`, NaN where
    not run): the rate of the model's own parameter pages, which can read slower or faster than a fresh buffer's.
    A compiled step reads its fused q/k/v and gate/up weights from copies made at compile time, so it can come in
    under this floor. `*_share` = floor ÷ cost: the share of the floor reached (1 = at
    it). They count weight reads only (KV-cache reads and activations come on top), so a ratio near 1 means
    the step is memory-bound at that rate; far above 1, overhead- or kernel-bound. Empty without floor rows."""
    if floor is None or floor.empty or timing.empty:
        return pd.DataFrame()
    keys = [k for k in FLOOR_KEYS if k in timing.columns and k in floor.columns]
    floor = floor if "probe" in floor.columns else floor.assign(probe="matvec")  # runs before the read probe
    probes = floor.assign(bandwidth=floor["probe_bytes"] / floor["t_stream"])
    bw = (
        probes.groupby(keys, dropna=False)
        .agg(target_weight_bytes=("target_weight_bytes", "max"), draft_weight_bytes=("draft_weight_bytes", "max"))
        .reset_index()
    )
    rates = {
        "bandwidth": ("matvec", "median"),
        "read_bandwidth": ("read", "max"),
        "read_bandwidth_median": ("read", "median"),
        "kernel_bandwidth": ("kernel", "median"),
        "own_target_bandwidth": ("read_target", "max"),
        "own_draft_bandwidth": ("read_draft", "max"),
    }
    for column, (probe, how) in rates.items():
        rate = probes[probes["probe"] == probe].groupby(keys, dropna=False)["bandwidth"].agg(how).rename(column)
        bw = bw.merge(rate.reset_index(), on=keys, how="left")
    out = timing[[*keys, *(k for k in ("batch_size",) if k in timing.columns), "ct1", "cd_per_token"]].merge(
        bw, on=keys, how="inner"
    )
    has_draft = out["draft_weight_bytes"] > 0
    for suffix, target_rate, draft_rate in (
        ("", "bandwidth", "bandwidth"),
        ("_read", "read_bandwidth", "read_bandwidth"),
        ("_kernel", "kernel_bandwidth", "kernel_bandwidth"),
        ("_own", "own_target_bandwidth", "own_draft_bandwidth"),
    ):
        out[f"target_floor{suffix}"] = out["target_weight_bytes"] / out[target_rate]
        out[f"draft_floor{suffix}"] = (out["draft_weight_bytes"] / out[draft_rate]).where(has_draft)
        out[f"ct1_over_floor{suffix}"] = out["ct1"] / out[f"target_floor{suffix}"]
        out[f"cd_over_floor{suffix}"] = out["cd_per_token"] / out[f"draft_floor{suffix}"]
        out[f"ct1_floor_share{suffix}"] = 1 / out[f"ct1_over_floor{suffix}"]
        out[f"cd_floor_share{suffix}"] = 1 / out[f"cd_over_floor{suffix}"]
    return out

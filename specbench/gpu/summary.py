"""The device check's sweep in one table (`python -m specbench.gpu summary <sweep>`): per job, C_o's share of a
round, host syncs per round, and NVML energy per token per decoder; exit 1 when a job failed or none finished."""

from __future__ import annotations

import pandas as pd

from specbench.bench import runstore


def sweep_summary(sweep_dir) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per (batch_size, gamma) of the speculative rounds, the failed jobs)."""
    rounds = runstore.load_sweep(sweep_dir, "rounds")
    meta = runstore.load_meta(sweep_dir)
    spec = rounds[rounds["gamma"] > 0]
    costs = spec.assign(round_s=spec["t_draft"] + spec["t_verify"] + spec["t_overhead"])
    table = costs.groupby(["batch_size", "gamma"]).agg(
        rounds=("round_s", "size"),
        c_d_ms=("t_draft", "median"),
        c_t_ms=("t_verify", "median"),
        c_o_ms=("t_overhead", "median"),
        round_ms=("round_s", "median"),
        host_syncs=("host_syncs", lambda s: sorted(set(s))),
        accepted=("accepted", "mean"),
    )
    for col in ("c_d_ms", "c_t_ms", "c_o_ms", "round_ms"):
        table[col] *= 1e3
    table["c_o_share"] = costs.groupby(["batch_size", "gamma"]).apply(
        lambda g: g["t_overhead"].sum() / g["round_s"].sum(), include_groups=False
    )
    energy = [c for c in meta.columns if c.startswith("telemetry.decoders.") and c.endswith(".energy_per_token_j")]
    if energy and {"batch_size", "gamma"} <= set(meta.columns):
        per_job = meta.set_index(["batch_size", "gamma"])[energy]
        per_job.columns = [c.split(".")[2] + "_j_per_token" for c in energy]
        table = table.join(per_job.groupby(level=[0, 1]).median())
    return table.reset_index(), runstore.load_failures(sweep_dir)


def run(args) -> int:
    table, failed = sweep_summary(args.sweep_dir)
    print(f"jobs with rounds: {len(table)}, failed: {len(failed)}")
    if len(failed):
        print(failed[["job", "kind", "message"]].to_string(index=False))
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.4g}".format):
        print(table.to_string(index=False))
    return 1 if len(failed) or table.empty else 0

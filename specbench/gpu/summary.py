"""The device check's sweep in one table (`python -m specbench.gpu summary <sweep>`): per job, C_o's share of a
round, host syncs per round, and NVML energy per token per decoder; exit 1 when a job failed or none finished."""

from __future__ import annotations

import pandas as pd

from specbench.analysis.acceptance import expected_accept_length
from specbench.analysis.speedup import speedup_formula
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
    # done.json: the job's gamma is `gamma_setting`; NVML energy per new token per decoder under `telemetry`
    prefix = "telemetry.energy_per_token_j_by_decoder."
    energy = [c for c in meta.columns if c.startswith(prefix)]
    if energy:
        per_job = meta.rename(columns={"gamma_setting": "gamma"}).set_index(["batch_size", "gamma"])[energy]
        per_job.columns = [c.removeprefix(prefix) + "_j_per_token" for c in energy]
        table = table.join(per_job.groupby(level=[0, 1]).median())
    return table.reset_index(), runstore.load_failures(sweep_dir)


def run(args) -> int:
    table, failed = sweep_summary(args.sweep_dir)
    print(f"jobs with rounds: {len(table)}, failed: {len(failed)}")
    if len(failed):
        print(failed[["job", "kind", "message"]].to_string(index=False))
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.4g}".format):
        print(table.to_string(index=False))
    if args.alphas:
        print("optimal γ per batch size at a given acceptance α (cost model; this machine's C_d, C_t(k), C_o):")
        with pd.option_context("display.width", 200, "display.float_format", "{:.3g}".format):
            print(gamma_by_batch(args.sweep_dir, args.alphas).to_string(index=False))
    return 1 if len(failed) or table.empty else 0


def gamma_by_batch(sweep_dir, alphas: list[float], gamma_max: int = 15) -> pd.DataFrame:
    """The cost model's optimal γ per batch size with this machine's costs and a GIVEN acceptance α per position
    (shape-only models accept nothing: their acceptance has to come from elsewhere). Costs from the sweep: C_t(k)
    from its micro-benchmark (median over jobs of a batch size), the draft's cost per drafted token and C_o from
    its speculative rounds (medians)."""
    ct = runstore.load_sweep(sweep_dir, "ct").groupby(["batch_size", "k"])["t_forward"].median()
    rounds = runstore.load_sweep(sweep_dir, "rounds")
    spec = rounds[rounds["gamma"] > 0]
    per_draft_token = (spec["t_draft"] / spec["gamma"]).groupby(spec["batch_size"]).median()
    overhead = spec.groupby("batch_size")["t_overhead"].median()
    rows = []
    for batch in sorted(per_draft_token.index):
        ks = ct.loc[batch]
        for alpha in alphas:
            best = max(
                (
                    speedup_formula(
                        expected_accept_length(alpha, g),
                        ks.loc[1],
                        g * per_draft_token[batch],
                        ks.loc[min(g + 1, ks.index.max())],
                        overhead[batch],
                    ),
                    g,
                )
                for g in range(1, gamma_max + 1)
            )
            rows.append({"batch_size": batch, "alpha": alpha, "gamma_star": best[1], "speedup_at_gamma_star": best[0]})
    return pd.DataFrame(rows).assign(
        c_t1_ms=lambda d: [ct.loc[(b, 1)] * 1e3 for b in d["batch_size"]],
        c_d_per_token_ms=lambda d: [per_draft_token[b] * 1e3 for b in d["batch_size"]],
    )

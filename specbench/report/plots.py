"""Report plots: matplotlib's object API on the Agg canvas (no pyplot, no display).

Each function takes the report's precomputed tables and returns (Figure | None, note | None).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from specbench.analysis.rows import (
    ACCEPTANCE_KEYS,
    AR_IGNORE,
    SETTING_KEYS,
    TIMING_KEYS,
    ar_rows,
    full_batch,
    iter_groups,
    match_rows,
    round_level,
    spec_rows,
)
from specbench.analysis.stats import eval_monotone_curve, fit_monotone_curve
from specbench.report.render import fmt_value


def varying(df: pd.DataFrame, keys) -> list[str]:
    """The keys among `keys` that take more than one value in df."""
    return [k for k in keys if k in df.columns and df[k].nunique(dropna=False) > 1]


def label(kd: dict, keys: list[str]) -> str:
    """Legend/title text of a group's keys."""
    return (
        ", ".join(f"{fmt_value(kd[k])}" if k != "batch_size" else f"batch {fmt_value(kd[k])}" for k in keys if k in kd)
        or "all"
    )


def _grid(n: int, w: float = 4.6, h: float = 3.4, ncols: int = 3):
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(n)]
    return fig, axes


def _limit(groups: list, most: int, what: str) -> tuple[list, str | None]:
    if len(groups) > most:
        return groups[:most], f"{what}: showing {most} of {len(groups)} groups"
    return groups, None


def plot_acceptance(acc: pd.DataFrame, max_lines: int = 10):
    """α_i with Wilson CIs vs draft position, one line per group."""
    if acc.empty:
        return None, "acceptance by position: no speculative rounds"
    keys = varying(acc, [*ACCEPTANCE_KEYS, "category"])
    groups, note = _limit(list(iter_groups(acc, keys)), max_lines, "acceptance by position")
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for j, (kd, sub) in enumerate(groups):
        sub = sub[sub["trials"] > 0]
        x = sub["position"].to_numpy() + (j - (len(groups) - 1) / 2) * 0.06
        y = sub["alpha"].to_numpy()
        err = np.vstack([y - sub["alpha_lo"].to_numpy(), sub["alpha_hi"].to_numpy() - y])
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=label(kd, keys))
    ax.set_xlabel("draft position i")
    ax.set_ylabel("α_i = P(accept i | 1..i−1 accepted)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Acceptance by position (95% Wilson CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig, note


def plot_accept_length(cmp_df: pd.DataFrame, max_panels: int = 9):
    """Measured E[N] per γ against the single-α and per-position predictions."""
    if cmp_df.empty:
        return None, "E[N] vs γ: no speculative rounds"
    keys = varying(cmp_df, ACCEPTANCE_KEYS)
    groups, note = _limit(list(iter_groups(cmp_df, keys)), max_panels, "E[N] vs γ")
    fig, axes = _grid(len(groups))
    for ax, (kd, sub) in zip(axes, groups):
        sub = sub.sort_values("gamma")
        g = sub["gamma"].to_numpy()
        y = sub["accept_length"].to_numpy()
        err = np.vstack([y - sub["accept_length_lo"], sub["accept_length_hi"] - y])
        ax.errorbar(g, y, yerr=np.nan_to_num(err), fmt="ko", capsize=3, label="measured mean(accepted+1)")
        ax.plot(g, sub["pred_positional"], "-s", label="model: per-position α_i")
        ax.plot(g, sub["pred_single"], "--^", label="model: single α")
        ax.set_xlabel("γ (tokens drafted per round)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("E[N] (tokens per round)")
        ax.set_title(label(kd, keys), fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Accept length E[N]: measured (95% CI) vs predicted")
    return fig, note


def plot_speedup(svm: pd.DataFrame, curves: dict, max_panels: int = 9):
    """Measured decode latency speedup per γ (median, CI) with the model curve and its optimum.
    `curves`: {sorted (key, str(value)) tuple of the varying setting keys: predict_speedup frame}."""
    if svm.empty:
        return None, "speedup vs γ: no paired speculative/AR requests"
    keys = varying(svm, SETTING_KEYS)
    groups, note = _limit(list(iter_groups(svm, keys)), max_panels, "speedup vs γ")
    fig, axes = _grid(len(groups))
    for ax, (kd, sub) in zip(axes, groups):
        sub = sub.sort_values("gamma")
        g = sub["gamma"].to_numpy()
        y = sub["latency_speedup"].to_numpy()
        err = np.vstack([y - sub["latency_speedup_lo"], sub["latency_speedup_hi"] - y])
        ax.errorbar(g, y, yerr=np.nan_to_num(err), fmt="ko", capsize=3, label="measured (median, 95% CI)", zorder=3)
        curve = curves.get(tuple(sorted((k, str(v)) for k, v in kd.items())))
        if curve is not None:
            ax.plot(curve["gamma"], curve["predicted_speedup"], "-", label="model")
            ax.plot(curve["gamma"], curve["ideal_speedup"], ":", label="ideal (C_o = 0)")
            best = curve.loc[curve["predicted_speedup"].idxmax()]
            ax.plot(
                [best["gamma"]], [best["predicted_speedup"]], "*", ms=12, label=f"model optimum γ={int(best['gamma'])}"
            )
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("γ (tokens drafted per round)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("decode latency speedup vs AR (×)")
        ax.set_title(label(kd, keys), fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Decode latency speedup vs γ: measured vs cost model")
    return fig, note


def plot_cost_breakdown(rounds: pd.DataFrame, max_panels: int = 9):
    """Stacked median C_d / C_t / C_o per round vs γ, with the AR step time."""
    sp = spec_rows(rounds)
    if sp.empty:
        return None, "cost breakdown: no speculative rounds"
    rl = round_level(sp)
    ar = round_level(ar_rows(rounds))
    keys = varying(rl, TIMING_KEYS)
    groups, note = _limit(list(iter_groups(rl, keys)), max_panels, "cost breakdown")
    fig, axes = _grid(len(groups))
    for ax, (kd, sub) in zip(axes, groups):
        med = full_batch(sub).groupby("gamma")[["t_draft", "t_verify", "t_overhead"]].median() * 1e3
        x = med.index.to_numpy()
        bottom = np.zeros(len(x))
        for col, lab in (("t_draft", "C_d(γ) draft"), ("t_verify", "C_t(γ+1) verify"), ("t_overhead", "C_o overhead")):
            ax.bar(x, med[col].to_numpy(), bottom=bottom, label=lab, width=0.7)
            bottom += med[col].to_numpy()
        a = ar[match_rows(ar, kd, ignore=AR_IGNORE)] if len(ar) else ar
        if len(a):
            ax.axhline(
                float(full_batch(a)["t_round"].median()) * 1e3, color="k", ls="--", lw=1, label="AR step (C_t1 per row)"
            )
        ax.set_xlabel("γ (tokens drafted per round)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("median time per round (ms)")
        ax.set_title(label(kd, keys), fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=7)
    fig.suptitle("Per-round cost components (full-batch rounds)")
    return fig, note


def plot_ct(pts: pd.DataFrame, source: str, max_panels: int = 6):
    """C_t(k) observations, medians and the monotone fit (extrapolated dashed), per batch size."""
    if pts.empty:
        return None, "C_t(k): no target-forward timings"
    pkeys = varying(pts, ("hardware", "dtype", "target"))
    groups = list(iter_groups(pts, pkeys))[:max_panels]
    fig, axes = _grid(len(groups), w=7.5, h=4.5, ncols=2)
    for ax, (kd, sub) in zip(axes, groups):
        bkeys = ["batch_size"] if "batch_size" in sub.columns else []
        for j, (bd, bsub) in enumerate(iter_groups(sub, bkeys)):
            color = f"C{j % 10}"
            lab = f"batch {fmt_value(bd['batch_size'])}" if bd else "all"
            ax.scatter(bsub["k"], bsub["t"] * 1e3, s=6, alpha=0.25, color=color)
            ks, ts = fit_monotone_curve(bsub["k"], bsub["t"])
            med = bsub.groupby("k")["t"].median()
            ax.plot(med.index, med.to_numpy() * 1e3, "o", color=color, ms=4, mfc="none")
            if ks:
                grid_in = np.arange(min(ks), max(ks) + 1)
                grid_out = np.arange(max(ks), max(ks) + 5)
                ax.plot(
                    grid_in,
                    np.asarray(eval_monotone_curve(ks, ts, grid_in)) * 1e3,
                    "-",
                    color=color,
                    label=f"{lab}: monotone fit",
                )
                ax.plot(grid_out, np.asarray(eval_monotone_curve(ks, ts, grid_out)) * 1e3, "--", color=color)
        ax.set_xlabel("k (new tokens per target forward)")
        ax.set_ylabel("C_t(k) (ms per forward)")
        ax.set_title((label(kd, pkeys) + "\n" if pkeys else "") + f"source: {source}", fontsize=9)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("C_t(k): points, medians (o), monotone fit, linear extrapolation (--)")
    return fig, None


def _best_per_batch(ax, df: pd.DataFrame, metric: str, wkeys, dkeys, rate: str):
    """AR and best-γ speculative tok/s vs batch size, one colour per workload group."""
    for j, (kd, sub) in enumerate(iter_groups(df, wkeys)):
        color = f"C{j % 10}"
        ar = sub.groupby("batch_size")["ar_tok_s"].median()
        ax.plot(ar.index, ar.to_numpy(), "--o", color=color, label=f"{label(kd, wkeys)}: AR")
        for i, (dd, dsub) in enumerate(iter_groups(sub, dkeys)):
            dsub = dsub.dropna(subset=[metric])
            if dsub.empty:
                continue
            best = dsub.loc[dsub.groupby("batch_size")[metric].idxmax()].sort_values("batch_size")
            lab = f"{label(kd, wkeys)}: spec {label(dd, dkeys) if dkeys else ''} (best γ)".replace("  ", " ")
            ax.plot(best["batch_size"], best["spec_tok_s"], "-", marker="s^vDP"[i % 5], color=color, label=lab)
    ax.set_ylabel(rate)


def plot_tokens_per_second(latency: pd.DataFrame, throughput: pd.DataFrame):
    """Per-request tok/s (latency table) and aggregate batch tok/s (throughput table) vs batch size."""
    if latency.empty or "batch_size" not in latency.columns or latency["batch_size"].nunique() < 2:
        return None, "tokens/s vs batch size: skipped (fewer than two batch sizes in this sweep)"
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    wkeys = varying(latency, ("workload", "target", "sampling"))
    dkeys = varying(latency, ("draft", "decoder"))
    _best_per_batch(ax1, latency, "latency_speedup", wkeys, dkeys, "tokens/s per request (Σ new / Σ wall)")
    if len(throughput):
        _best_per_batch(
            ax2, throughput, "throughput_speedup", wkeys, dkeys, "tokens/s per batch (Σ tokens / Σ batch wall)"
        )
    bvals = sorted(latency["batch_size"].unique())
    for ax in (ax1, ax2):
        ax.set_xlabel("batch size (requests)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(bvals, [str(int(b)) for b in bvals])
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    ax1.set_title("Per-request decoding rate (best γ by latency speedup)")
    ax2.set_title("Aggregate throughput (best γ by throughput speedup)")
    return fig, None


def plot_acceptance_histogram(hist: pd.DataFrame, max_panels: int = 9):
    """Fraction of rounds per acceptance length (accepted + 1), one panel per setting, one bar group per γ."""
    if hist.empty:
        return None, "acceptance-length histogram: no speculative rounds"
    gcol = "gamma_setting" if "gamma_setting" in hist.columns else None
    keys = varying(hist, [*ACCEPTANCE_KEYS, "batch_size"])
    groups, note = _limit(list(iter_groups(hist, keys)), max_panels, "acceptance-length histogram")
    fig, axes = _grid(len(groups))
    for ax, (kd, sub) in zip(axes, groups):
        sets = list(iter_groups(sub, [gcol] if gcol else []))
        width = 0.8 / max(1, len(sets))
        for j, (gd, gsub) in enumerate(sets):
            gsub = gsub[gsub["count"] > 0] if gcol is None else gsub
            x = gsub["acceptance_length"].to_numpy(float) + (j - (len(sets) - 1) / 2) * width
            ax.bar(x, gsub["fraction"].to_numpy(float), width=width, label=f"γ={fmt_value(gd[gcol])}" if gcol else None)
        ax.set_xlabel("acceptance length (accepted + 1)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("fraction of rounds")
        ax.set_title(label(kd, keys), fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        if gcol:
            ax.legend(fontsize=7)
    fig.suptitle("Acceptance length per round")
    return fig, note


def plot_context(table: pd.DataFrame, max_lines: int = 6):
    """C_t, C_d per token, α and the best γ vs context length: measured (markers) vs the context model (lines)."""
    if table.empty:
        return None, "context length: fewer than two context levels per setting"
    keys = varying(table, (*ACCEPTANCE_KEYS, "hardware", "dtype", "batch_size"))
    groups, note = _limit(list(iter_groups(table, keys)), max_lines, "context length")
    ct_cols = [c for c in table.columns if c.startswith("C_t(") and c.endswith("measured")]
    fig, axes = _grid(4, ncols=2)
    for j, (kd, sub) in enumerate(groups):
        sub = sub.sort_values("context tokens")
        x = sub["context tokens"].to_numpy(float)
        color, lab = f"C{j % 10}", label(kd, keys)
        for i, col in enumerate(ct_cols):
            name = col.removesuffix(" ms measured")
            ax = axes[0]
            ax.plot(x, sub[col], "os"[i % 2], color=color, label=f"{lab}: {name} measured")
            ax.plot(x, sub[col.replace("measured", "model")], "-" if i == 0 else "--", color=color)
        axes[1].plot(x, sub["C_d/token ms measured"], "o", color=color, label=f"{lab}: measured")
        axes[1].plot(x, sub["C_d/token ms model"], "-", color=color)
        axes[2].plot(x, sub["α measured"], "o", color=color, label=f"{lab}: measured")
        axes[2].plot(x, sub["α model (pooled)"], "-", color=color)
        axes[3].plot(x, sub["best γ measured"], "o", color=color, label=f"{lab}: best measured")
        axes[3].plot(x, sub["γ* model"], "-", color=color)
    for ax, ylab in zip(
        axes, ("C_t(k) (ms per forward)", "C_d per drafted token (ms)", "α (single, pooled model)", "γ")
    ):
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(ylab)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[3].yaxis.get_major_locator().set_params(integer=True)
    fig.suptitle("How costs, acceptance and the optimal γ move with context: measured (markers) vs model (lines)")
    return fig, note

"""Sweep report: markdown + self-contained HTML + PNG plots, computed from raw rows.

    python -m specbench.report runs/<sweep> [--out DIR] [--ct PATH]

`build_report(rounds, requests, ct, out_dir)` does all the work from DataFrames;
`load_tables(sweep_dir)` is the only place that touches the run store.
Plots use matplotlib's object API with the Agg canvas (no pyplot, no display).
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import html
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from specbench import costmodel as cm

PLOT_DPI = 100


# --------------------------------------------------------------------------- loading


def _read_table(path) -> pd.DataFrame:
    path = Path(path)
    if path.suffix == ".csv":
        return pd.read_csv(path)
    if path.suffix == ".json":
        return pd.read_json(path)
    return pd.read_parquet(path)


def load_tables(sweep_dir, ct=None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """(rounds, requests, ct) of a sweep via `specbench.runstore.load_sweep`.

    `ct` may be a DataFrame, a path (.parquet/.csv/.json) or None; None tries the sweep's
    own "ct" table and uses None (C_t from the rounds) if it has none.
    """
    from specbench.bench.runstore import load_sweep  # written alongside; imported lazily

    rounds = load_sweep(sweep_dir, "rounds")
    requests = load_sweep(sweep_dir, "requests")
    if ct is None:
        try:
            ct = load_sweep(sweep_dir, "ct")
        except ValueError:  # no finished job wrote a ct table: C_t falls back to the rounds
            ct = None
        if ct is not None and len(ct) == 0:
            ct = None
    elif not isinstance(ct, pd.DataFrame):
        ct = _read_table(ct)
    return rounds, requests, ct


# --------------------------------------------------------------------------- formatting


def _fmt_value(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return "–"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if v == int(v) and abs(v) < 1e6:
            return str(int(v))
        if abs(v) >= 100:
            return f"{v:.1f}"
        if abs(v) >= 0.01:
            return f"{v:.3f}"
        return f"{v:.3g}"
    return str(v)


def _strings(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({c: [_fmt_value(v) for v in df[c]] for c in df.columns}, index=range(len(df)))


def _md_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "_(no rows)_\n"
    s = _strings(df)
    esc = lambda x: str(x).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(c) for c in s.columns) + " |", "|" + "---|" * len(s.columns)]
    lines += ["| " + " | ".join(esc(v) for v in row) + " |" for row in s.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def _html_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "<p><em>(no rows)</em></p>"
    return _strings(df).to_html(index=False, escape=True, border=0, classes="t")


def _ci(s, lo, hi) -> str:
    return cm._fmt_speedup(s, lo, hi)


def _varying(df: pd.DataFrame, keys) -> list[str]:
    return [k for k in keys if k in df.columns and df[k].nunique(dropna=False) > 1]


def _drop_constant_keys(df: pd.DataFrame, keys=(*cm.SETTING_KEYS, "category")) -> pd.DataFrame:
    """Drop key columns that hold one value (they are in the report header)."""
    return df.drop(columns=[k for k in keys if k in df.columns and df[k].nunique(dropna=False) <= 1])


def _label(kd: dict, keys: list[str]) -> str:
    return ", ".join(f"{_fmt_value(kd[k])}" if k not in ("batch_size",) else f"batch {_fmt_value(kd[k])}"
                     for k in keys if k in kd) or "all"


# --------------------------------------------------------------------------- report model


@dataclass
class Section:
    title: str
    text: list[str] = field(default_factory=list)  # paragraphs (plain text)
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    pre: list[str] = field(default_factory=list)  # preformatted blocks
    figures: list[tuple[str, str]] = field(default_factory=list)  # (png file name, caption)
    notes: list[str] = field(default_factory=list)


def _grid(n: int, w: float = 4.6, h: float = 3.4, ncols: int = 3):
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(n)]
    return fig, axes


# --------------------------------------------------------------------------- plots
# Each returns (Figure | None, note | None).


def plot_acceptance(acc: pd.DataFrame, max_lines: int = 10):
    if acc.empty:
        return None, "acceptance by position: no speculative rounds"
    keys = _varying(acc, [*cm.ACCEPTANCE_KEYS, "category"])
    groups = list(cm._iter_groups(acc, keys))
    note = None
    if len(groups) > max_lines:
        note = f"acceptance by position: showing {max_lines} of {len(groups)} groups"
        groups = groups[:max_lines]
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for j, (kd, sub) in enumerate(groups):
        sub = sub[sub["trials"] > 0]
        x = sub["position"].to_numpy() + (j - (len(groups) - 1) / 2) * 0.06
        y = sub["alpha"].to_numpy()
        err = np.vstack([y - sub["alpha_lo"].to_numpy(), sub["alpha_hi"].to_numpy() - y])
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=_label(kd, keys))
    ax.set_xlabel("draft position i")
    ax.set_ylabel("α_i = P(accept i | 1..i−1 accepted)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Acceptance by position (95% Wilson CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig, note


def plot_accept_length(cmp_df: pd.DataFrame, max_panels: int = 9):
    if cmp_df.empty:
        return None, "E[N] vs γ: no speculative rounds"
    keys = _varying(cmp_df, cm.ACCEPTANCE_KEYS)
    groups = list(cm._iter_groups(cmp_df, keys))
    note = None
    if len(groups) > max_panels:
        note = f"E[N] vs γ: showing {max_panels} of {len(groups)} groups"
        groups = groups[:max_panels]
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
        ax.set_title(_label(kd, keys), fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Accept length E[N]: measured (95% CI) vs predicted")
    return fig, note


def plot_speedup(svm: pd.DataFrame, curves: dict, max_panels: int = 9):
    if svm.empty:
        return None, "speedup vs γ: no paired speculative/AR requests"
    keys = _varying(svm, cm.SETTING_KEYS)
    groups = list(cm._iter_groups(svm, keys))
    note = None
    if len(groups) > max_panels:
        note = f"speedup vs γ: showing {max_panels} of {len(groups)} settings"
        groups = groups[:max_panels]
    fig, axes = _grid(len(groups))
    for ax, (kd, sub) in zip(axes, groups):
        sub = sub.sort_values("gamma")
        g = sub["gamma"].to_numpy()
        y = sub["speedup"].to_numpy()
        err = np.vstack([y - sub["speedup_lo"], sub["speedup_hi"] - y])
        ax.errorbar(g, y, yerr=np.nan_to_num(err), fmt="ko", capsize=3, label="measured (median, 95% CI)", zorder=3)
        key = tuple(sorted((k, str(v)) for k, v in kd.items()))
        curve = curves.get(key)
        if curve is not None:
            ax.plot(curve["gamma"], curve["speedup"], "-", label="model")
            ax.plot(curve["gamma"], curve["ideal_speedup"], ":", label="ideal (C_o = 0)")
            best = curve.loc[curve["speedup"].idxmax()]
            ax.plot([best["gamma"]], [best["speedup"]], "*", ms=12, label=f"model optimum γ={int(best['gamma'])}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("γ (tokens drafted per round)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("decode speedup vs AR (×)")
        ax.set_title(_label(kd, keys), fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Decode speedup vs γ: measured vs cost model")
    return fig, note


def plot_cost_breakdown(rounds: pd.DataFrame, max_panels: int = 9):
    sp = cm.spec_rows(rounds)
    if sp.empty:
        return None, "cost breakdown: no speculative rounds"
    rl = cm.round_level(sp)
    ar = cm.round_level(cm.ar_rows(rounds))
    keys = _varying(rl, cm.TIMING_KEYS)
    groups = list(cm._iter_groups(rl, keys))
    note = None
    if len(groups) > max_panels:
        note = f"cost breakdown: showing {max_panels} of {len(groups)} timing settings"
        groups = groups[:max_panels]
    fig, axes = _grid(len(groups))
    for ax, (kd, sub) in zip(axes, groups):
        sub = cm._full_batch(sub)
        med = sub.groupby("gamma")[["t_draft", "t_verify", "t_overhead"]].median() * 1e3
        x = med.index.to_numpy()
        bottom = np.zeros(len(x))
        for col, lab in (("t_draft", "C_d(γ) draft"), ("t_verify", "C_t(γ+1) verify"), ("t_overhead", "C_o overhead")):
            ax.bar(x, med[col].to_numpy(), bottom=bottom, label=lab, width=0.7)
            bottom += med[col].to_numpy()
        a = ar[cm._match(ar, kd, ignore=cm._AR_IGNORE)] if len(ar) else ar
        if len(a):
            a = cm._full_batch(a)
            ax.axhline(float(a["t_round"].median()) * 1e3, color="k", ls="--", lw=1, label="AR step (C_t1 per row)")
        ax.set_xlabel("γ (tokens drafted per round)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("median time per round (ms)")
        ax.set_title(_label(kd, keys), fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=7)
    fig.suptitle("Per-round cost components (full-batch rounds)")
    return fig, note


def ct_points(rounds: pd.DataFrame, ct: pd.DataFrame | None) -> tuple[pd.DataFrame, str]:
    """C_t(k) observations: the micro-benchmark table if given, else the rounds'
    t_verify (speculative at k = γ+1, AR at k = 1). Columns: hardware, dtype, target,
    batch_size (those present), k, t; and the source name."""
    keys = ["hardware", "dtype", "target", "batch_size"]
    if ct is not None and len(ct):
        k = [c for c in keys if c in ct.columns]
        return ct[k + ["k"]].assign(t=ct["t_forward"].to_numpy(float)), "C_t micro-benchmark table"
    sp = cm.round_level(cm.spec_rows(rounds))
    ar = cm.round_level(cm.ar_rows(rounds))
    k = [c for c in keys if c in rounds.columns]
    pts = pd.concat([sp[k].assign(k=sp["gamma"].to_numpy(int) + 1, t=sp["t_verify"].to_numpy(float)),
                     ar[k].assign(k=1, t=ar["t_verify"].to_numpy(float))], ignore_index=True)
    return pts, "rounds' t_verify (fallback: no C_t table)"


def plot_ct(rounds: pd.DataFrame, ct: pd.DataFrame | None, max_panels: int = 6):
    pts, source = ct_points(rounds, ct)
    if pts.empty:
        return None, "C_t(k): no target-forward timings"
    pkeys = _varying(pts, ("hardware", "dtype", "target"))
    groups = list(cm._iter_groups(pts, pkeys))[:max_panels]
    fig, axes = _grid(len(groups), w=7.5, h=4.5, ncols=2)
    for ax, (kd, sub) in zip(axes, groups):
        bkeys = ["batch_size"] if "batch_size" in sub.columns else []
        for j, (bd, bsub) in enumerate(cm._iter_groups(sub, bkeys)):
            color = f"C{j % 10}"
            lab = f"batch {_fmt_value(bd['batch_size'])}" if bd else "all"
            ax.scatter(bsub["k"], bsub["t"] * 1e3, s=6, alpha=0.25, color=color)
            ks, ts = cm.fit_monotone_curve(bsub["k"], bsub["t"])
            med = bsub.groupby("k")["t"].median()
            ax.plot(med.index, med.to_numpy() * 1e3, "o", color=color, ms=4, mfc="none")
            if ks:
                grid_in = np.arange(min(ks), max(ks) + 1)
                grid_out = np.arange(max(ks), max(ks) + 5)
                ax.plot(grid_in, np.asarray(cm.eval_monotone_curve(ks, ts, grid_in)) * 1e3, "-", color=color,
                        label=f"{lab}: monotone fit")
                ax.plot(grid_out, np.asarray(cm.eval_monotone_curve(ks, ts, grid_out)) * 1e3, "--", color=color)
        ax.set_xlabel("k (new tokens per target forward)")
        ax.set_ylabel("C_t(k) (ms per forward)")
        ax.set_title((_label(kd, pkeys) + "\n" if pkeys else "") + f"source: {source}", fontsize=9)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("C_t(k): points, medians (o), monotone fit, linear extrapolation (--)")
    return fig, None


def plot_tokens_per_second(meas: pd.DataFrame):
    """meas: measured_speedup by (workload, draft, decoder, batch_size, gamma) on wall basis."""
    if meas.empty or "batch_size" not in meas.columns or meas["batch_size"].nunique() < 2:
        return None, "tokens/s vs batch size: skipped (fewer than two batch sizes in this sweep)"
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    wkeys = _varying(meas, ("workload", "target", "sampling"))
    dkeys = _varying(meas, ("draft", "decoder"))
    for j, (kd, sub) in enumerate(cm._iter_groups(meas, wkeys)):
        color = f"C{j % 10}"
        ar = sub.groupby("batch_size")["ar_tok_s"].median()
        for ax, scale in ((ax1, 1), (ax2, ar.index.to_numpy())):
            ax.plot(ar.index, ar.to_numpy() * scale, "--o", color=color, label=f"{_label(kd, wkeys)}: AR")
        for i, (dd, dsub) in enumerate(cm._iter_groups(sub, dkeys)):
            best = dsub.loc[dsub.groupby("batch_size")["speedup"].idxmax()].sort_values("batch_size")
            b = best["batch_size"].to_numpy()
            lab = f"{_label(kd, wkeys)}: spec {_label(dd, dkeys) if dkeys else ''} (best γ)".replace("  ", " ")
            mk = "s^vDP"[i % 5]
            ax1.plot(b, best["spec_tok_s"], "-", marker=mk, color=color, label=lab)
            ax2.plot(b, best["spec_tok_s"] * b, "-", marker=mk, color=color, label=lab)
    ax1.set_ylabel("tokens/s per request (Σ new / Σ wall)")
    ax2.set_ylabel("tokens/s aggregate (≈ per request × batch)")
    for ax in (ax1, ax2):
        ax.set_xlabel("batch size (requests)")
        ax.set_xscale("log", base=2)
        bvals = sorted(meas["batch_size"].unique())
        ax.set_xticks(bvals, [str(int(b)) for b in bvals])
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    ax1.set_title("Per-request decoding rate")
    ax2.set_title("Aggregate throughput")
    return fig, None


# --------------------------------------------------------------------------- build


def _save(fig: Figure, out_dir: Path, name: str) -> Path:
    path = out_dir / name
    fig.savefig(path, dpi=PLOT_DPI, format="png")
    return path


def build_report(
    rounds: pd.DataFrame,
    requests: pd.DataFrame,
    ct: pd.DataFrame | None = None,
    out_dir="report",
    *,
    title: str | None = None,
    gamma_max: int = 16,
    n_resamples: int = 2000,
    seed: int = 0,
) -> dict:
    """Compute everything from the raw tables and write report.md, report.html (self-
    contained: plots embedded as data URIs) and the PNG plots into out_dir.

    Returns {"markdown": Path, "html": Path, "figures": [Path], "notes": [str]}.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rounds, requests = cm.add_gamma_setting(rounds, requests)
    bs = dict(n_resamples=n_resamples, seed=seed)
    sections: list[Section] = []
    figures: list[Path] = []
    notes: list[str] = []

    def add_fig(sec: Section, res, name: str, caption: str):
        fig, note = res
        if note:
            sec.notes.append(note)
            notes.append(note)
        if fig is not None:
            figures.append(_save(fig, out_dir, name))
            sec.figures.append((name, caption))

    has_spec = not cm.spec_rows(rounds).empty

    # Summary + recommendations
    summ = cm.summary_table(rounds, requests, **bs)
    s = Section("Summary", text=[
        "Per setting: acceptance = Σaccepted/Σγ; E[N] = mean(accepted+1); tokens/s = Σ new tokens / Σ wall time "
        "of the paired requests; speedup = median over prompts of (AR wall time per token) / (speculative wall "
        "time per token), end to end (prefill included), 95% percentile-bootstrap CI over prompts."])
    s.pre.append(cm.format_summary(summ))
    sections.append(s)

    rec = cm.recommendations(rounds, requests, ct, gamma_max=gamma_max, **bs) if has_spec else pd.DataFrame()
    s = Section("Recommendations", text=[
        "Best measured setting per workload and batch size (largest median end-to-end speedup). verdict: "
        "'faster' if the whole 95% CI lies above 1×. model γ*: the cost model's optimal γ for that draft "
        f"(1..{gamma_max}) and its predicted decode speedup."])
    if not rec.empty:
        r = rec.copy()
        r["speedup [95% CI]"] = [_ci(a, b, c) for a, b, c in zip(r["speedup"], r["speedup_lo"], r["speedup_hi"])]
        r = r.drop(columns=["speedup", "speedup_lo", "speedup_hi"]).rename(
            columns={"model_gamma": "model γ*", "model_speedup": "model S(γ*)", "gamma": "γ"})
        s.tables.append(("", r))
    else:
        s.notes.append("no recommendations: no paired speculative requests")
    sections.append(s)

    # Acceptance
    s = Section("Acceptance", text=[
        "α_i = P(accepted ≥ i | accepted ≥ i−1), counted over rounds that drafted position i. E[N] uses "
        "accepted+1 (not committed, which is truncated at EOS/max_new_tokens). Single-α model: "
        "E[N] = (1−α^{γ+1})/(1−α) with the MLE α = Σaccepted / Σ(accepted + [accepted<γ]); per-position "
        "model: E[N] = 1 + Σ_i Π_{j≤i} α_j."])
    if has_spec:
        acc = cm.acceptance_by_position(rounds)
        add_fig(s, plot_acceptance(acc), "acceptance_by_position.png", "Per-position acceptance with 95% CI.")
        if "category" in rounds and rounds["category"].nunique() > 1:  # one workload, several kinds of traffic
            by_cat = cm.acceptance_by_position(rounds, by=[*cm.ACCEPTANCE_KEYS, "category"])
            add_fig(s, plot_acceptance(by_cat), "acceptance_by_category.png",
                    "Per-position acceptance with 95% CI, per prompt category.")
        cmp_df = cm.compare_accept_length_models(rounds)
        add_fig(s, plot_accept_length(cmp_df), "accept_length_vs_gamma.png",
                "E[N] vs γ: measured vs the two acceptance models.")
        a = acc.copy()
        a["α_i [95% CI]"] = [f"{x:.3f} [{lo:.3f}, {hi:.3f}]" if t else "–"
                            for x, lo, hi, t in zip(a["alpha"], a["alpha_lo"], a["alpha_hi"], a["trials"])]
        a = a.drop(columns=["successes", "alpha", "alpha_lo", "alpha_hi"])
        s.tables.append(("Per-position acceptance", _drop_constant_keys(a)))
        singles = []
        for kd, sub in cm._iter_groups(cm.spec_rows(rounds), _varying(cm.spec_rows(rounds), cm.ACCEPTANCE_KEYS)):
            f = cm.fit_alpha(sub)
            singles.append({**kd, "α (single)": f.alpha, "lo": f.lo, "hi": f.hi, "tested positions": f.trials})
        s.tables.append(("Single-α fit", pd.DataFrame(singles)))
        s.tables.append(("Which acceptance model fits E[N] better (mean |error| over γ)",
                         _drop_constant_keys(cm.which_accept_length_model(cmp_df))))
    else:
        s.notes.append("no speculative rounds in this sweep")
    sections.append(s)

    # Costs
    s = Section("Component costs", text=[
        "One observation per round (times are shared by a round's batch rows), full-batch rounds where there "
        "are at least 3. C_d(γ) = intercept + per-token·γ (least squares through the per-γ medians); C_t(k) = monotone (isotonic) fit "
        "of the median time per k, interpolated between tried k and extrapolated linearly beyond; C_o = "
        "median per γ (linear fit for untried γ); C_t1 = median AR time per token."])
    if has_spec:
        add_fig(s, plot_cost_breakdown(rounds), "cost_breakdown.png", "Stacked C_d / C_t / C_o per round vs γ.")
        s.tables.append(("Fitted timing profiles (seconds)", _drop_constant_keys(cm.timing_table(rounds, ct))))
    add_fig(s, plot_ct(rounds, ct), "ct_k.png", "Target forward time C_t(k) per batch size.")
    sections.append(s)

    # Speedup model
    s = Section("Speedup model", text=[
        "S(γ) = E[N]·C_t1 / (C_d(γ) + C_t(γ+1) + C_o(γ)); ideal: C_o = 0. Model-vs-measured comparisons use "
        "the decode phase ((wall − TTFT)/(new tokens − 1)), which is what the model describes. Leave-one-out: "
        "each γ is predicted from the α and timing fits of the other γ's rows only."])
    if has_spec:
        svm = cm.speedup_vs_model(rounds, requests, ct, gamma_max=gamma_max, **bs)
        curves = {}
        for kd, acc_p, tim_p in cm.fit_setting_profiles(rounds, ct):
            gm = int(max(svm["gamma"].max() + 2, 8)) if len(svm) else gamma_max
            key = tuple(sorted((k, str(v)) for k, v in kd.items() if k in _varying(svm, cm.SETTING_KEYS)))
            curves[key] = cm.predict_speedup(acc_p, tim_p, range(1, gm + 1))
        add_fig(s, plot_speedup(svm, curves), "speedup_vs_gamma.png",
                "Decode speedup vs γ: measured (95% CI), model, ideal.")
        t = svm.copy()
        t["measured [95% CI]"] = [_ci(a, b, c) for a, b, c in zip(t["speedup"], t["speedup_lo"], t["speedup_hi"])]
        t = _drop_constant_keys(t.drop(columns=["speedup", "speedup_lo", "speedup_hi"]))
        s.tables.append(("Measured vs predicted (rel_error = predicted/measured − 1)", t))
        loo = cm.leave_one_out(rounds, requests, ct, **bs)
        if loo.empty:
            s.notes.append("leave-one-out: needs at least two γ settings per setting")
        else:
            s.tables.append(("Leave-one-γ-out predictions", _drop_constant_keys(loo)))
            s.tables.append(("Leave-one-out |relative error|: simple vs context-length model",
                             _drop_constant_keys(cm.compare_context_model(rounds, requests, ct, simple=loo, **bs))))
    sections.append(s)

    # Throughput
    s = Section("Throughput vs batch size")
    if len(cm.paired_requests(requests)):
        meas = cm.measured_speedup(requests, [k for k in ("workload", "target", "sampling", "draft", "decoder",
                                                          "batch_size", "gamma") if k in requests.columns], **bs)
        add_fig(s, plot_tokens_per_second(meas), "tokens_per_second.png", "Tokens/s vs batch size.")
    else:
        s.notes.append("no paired requests")
    sections.append(s)

    meta = {
        "generated": _dt.datetime.now().isoformat(timespec="seconds"),
        "jobs": int(rounds["job"].nunique()) if "job" in rounds.columns else 1,
        "round rows": len(rounds),
        "requests": len(requests),
        "hardware": ", ".join(map(str, sorted(rounds["hardware"].dropna().unique()))) if "hardware" in rounds else "–",
        "C_t source": "micro-benchmark table" if ct is not None and len(ct) else "rounds (fallback)",
    }
    if "shape_only" in rounds and rounds["shape_only"].astype(bool).any():
        meta["shape-only models"] = "random weights: timings are real, acceptance and speedups are NOT meaningful"
    title = title or "Speculative decoding report"
    md = _render_md(title, meta, sections)
    html_text = _render_html(title, meta, sections, out_dir)
    md_path = out_dir / "report.md"
    html_path = out_dir / "report.html"
    md_path.write_text(md, encoding="utf-8")
    html_path.write_text(html_text, encoding="utf-8")
    return {"markdown": md_path, "html": html_path, "figures": figures, "notes": notes}


def _render_md(title, meta, sections) -> str:
    out = [f"# {title}", "", " · ".join(f"**{k}**: {v}" for k, v in meta.items()), ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        out += [p + "\n" for p in s.text]
        for block in s.pre:
            out += ["```", block, "```", ""]
        for name, cap in s.figures:
            out += [f"![{cap}]({name})", ""]
        for cap, df in s.tables:
            if cap:
                out += [f"**{cap}**", ""]
            out += [_md_table(df)]
        for n in s.notes:
            out += [f"> note: {n}", ""]
    return "\n".join(out)


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1300px;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:1.6em}
table.t{border-collapse:collapse;font-size:0.85em;margin:8px 0 16px}
table.t th,table.t td{border:1px solid #ddd;padding:3px 7px;text-align:right}
table.t th{background:#f3f3f3}
pre{background:#f7f7f7;padding:10px;overflow-x:auto;font-size:0.85em}
img{max-width:100%;border:1px solid #eee;margin:6px 0}
.note{color:#8a5a00;font-style:italic}.meta{color:#555;font-size:0.9em}
figcaption{color:#555;font-size:0.85em}
"""


def _render_html(title, meta, sections, out_dir: Path) -> str:
    e = html.escape
    out = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>", f"<title>{e(title)}</title>",
           f"<style>{_CSS}</style></head><body>", f"<h1>{e(title)}</h1>",
           "<p class='meta'>" + " · ".join(f"<b>{e(k)}</b>: {e(str(v))}" for k, v in meta.items()) + "</p>"]
    for s in sections:
        out.append(f"<h2>{e(s.title)}</h2>")
        out += [f"<p>{e(p)}</p>" for p in s.text]
        out += [f"<pre>{e(b)}</pre>" for b in s.pre]
        for name, cap in s.figures:
            data = base64.b64encode((out_dir / name).read_bytes()).decode("ascii")
            out.append(f"<figure><img alt='{e(cap)}' src='data:image/png;base64,{data}'>"
                       f"<figcaption>{e(cap)}</figcaption></figure>")
        for cap, df in s.tables:
            if cap:
                out.append(f"<h3>{e(cap)}</h3>")
            out.append(_html_table(df))
        out += [f"<p class='note'>note: {e(n)}</p>" for n in s.notes]
    out.append("</body></html>")
    return "\n".join(out)


def write_report(sweep_dir, out_dir=None, ct=None, **kw) -> dict:
    """Load a sweep's tables (see `load_tables`) and `build_report` into out_dir
    (default: <sweep_dir>/report)."""
    sweep_dir = Path(sweep_dir)
    rounds, requests, ct = load_tables(sweep_dir, ct)
    kw.setdefault("title", f"Speculative decoding report: {sweep_dir.name}")
    return build_report(rounds, requests, ct, out_dir or sweep_dir / "report", **kw)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specbench.report",
                                 description="Write report.md / report.html / PNG plots for a sweep.")
    ap.add_argument("sweep_dir", help="runs/<sweep> directory")
    ap.add_argument("--out", default=None, help="output directory (default: <sweep_dir>/report)")
    ap.add_argument("--ct", default=None, help="C_t(k) micro-benchmark table (.parquet/.csv/.json)")
    ap.add_argument("--gamma-max", type=int, default=16, help="largest γ for the model optimum (default 16)")
    ap.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    args = ap.parse_args(argv)
    res = write_report(args.sweep_dir, args.out, args.ct, gamma_max=args.gamma_max, n_resamples=args.resamples)
    print(f"wrote {res['markdown']}")
    print(f"wrote {res['html']}")
    for p in res["figures"]:
        print(f"wrote {p}")
    for n in res["notes"]:
        print(f"note: {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

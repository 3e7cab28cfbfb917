"""The report's sections and their plots, laid out from `ReportData` (`specbench.report.data`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specbench.analysis.rows import (
    SETTING_KEYS,
    ar_rows,
    round_level,
    spec_rows,
)
from specbench.analysis.stats import MEDIAN_CI_METHOD
from specbench.analysis.summary import format_ci, format_summary
from specbench.analysis.timing import CT_KEYS
from specbench.report import plots
from specbench.report.data import ReportData
from specbench.report.render import Section
from specbench.report.serving_view import (
    memory_section,
    schedule_section,
    serving_section,
)


def ct_points(rounds: pd.DataFrame, ct: pd.DataFrame | None) -> tuple[pd.DataFrame, str]:
    """C_t(k) observations: the micro-benchmark table if given, else the rounds' t_verify
    (speculative at k = γ+1, AR at k = 1). Columns: the CT_KEYS present, k, t; and the source name."""
    if ct is not None and len(ct):
        k, parts = [c for c in CT_KEYS if c in ct.columns], []
        if "k" in ct.columns:  # specbench's micro-benchmark rows
            own = ct[ct["k"].notna()]
            parts.append(own[k + ["k"]].assign(t=own["t_forward"].to_numpy(float)))
        if "role" in ct.columns:  # llama.cpp's llama-bench rows: `pp k` of the target
            pp = ct[(ct["role"] == "target") & (ct["n_gen"] == 0) & (ct["n_prompt"] > 0)]
            parts.append(pp[k].assign(k=pp["n_prompt"].to_numpy(int), t=pp["seconds"].to_numpy(float)))
        return pd.concat(parts, ignore_index=True), "C_t micro-benchmark table (llama.cpp: llama-bench)"
    sp = round_level(spec_rows(rounds))
    ar = round_level(ar_rows(rounds))
    k = [c for c in CT_KEYS if c in rounds.columns]
    pts = pd.concat(
        [
            sp[k].assign(k=sp["gamma"].to_numpy(int) + 1, t=sp["t_verify"].to_numpy(float)),
            ar[k].assign(k=1, t=ar["t_verify"].to_numpy(float)),
        ],
        ignore_index=True,
    )
    return pts, "rounds' t_verify (fallback: no C_t table)"


def hardware_limit_view(hl: pd.DataFrame) -> pd.DataFrame:
    """`hardware_limit` for reading: GB/s, MB, milliseconds and ratios."""
    ms = lambda col: (hl[col] * 1e3).round(2)
    view = hl[[k for k in ("hardware", "dtype", "forward", "target", "draft", "batch_size") if k in hl]].copy()
    view["matvec GB/s"] = (hl["bandwidth"] / 1e9).round(1)
    view["read GB/s"] = (hl["read_bandwidth"] / 1e9).round(1)
    view["target MB"] = (hl["target_weight_bytes"] / 1e6).round(1)
    view["target floor ms"] = ms("target_floor")
    view["C_t1 ms"] = ms("ct1")
    view["C_t1 ÷ floor"] = hl["ct1_over_floor"].round(2)
    view["C_t1 ÷ read floor"] = hl["ct1_over_floor_read"].round(2)
    view["draft MB"] = (hl["draft_weight_bytes"] / 1e6).round(1)
    view["draft floor ms"] = ms("draft_floor")
    view["C_d per token ms"] = ms("cd_per_token")
    view["C_d ÷ floor"] = hl["cd_over_floor"].round(2)
    view["C_d ÷ read floor"] = hl["cd_over_floor_read"].round(2)
    view["target's own read GB/s"] = (hl["own_target_bandwidth"] / 1e9).round(1)  # NaN where not run: dropped
    view["C_t1 ÷ own read floor"] = hl["ct1_over_floor_own"].round(2)
    view["draft's own read GB/s"] = (hl["own_draft_bandwidth"] / 1e9).round(1)
    view["C_d ÷ own read floor"] = hl["cd_over_floor_own"].round(2)
    return drop_constant_keys(view.dropna(axis=1, how="all"))


def drop_constant_keys(df: pd.DataFrame, keys=(*SETTING_KEYS, "category")) -> pd.DataFrame:
    """Drop key columns that hold one value (they are in the report header)."""
    return df.drop(columns=[k for k in keys if k in df.columns and df[k].nunique(dropna=False) <= 1])


def _with_ci(df: pd.DataFrame, metric: str, n: str, header: str) -> pd.DataFrame:
    """Replace metric, metric_lo, metric_hi, n by one 'x× [lo, hi] n=…' column named `header`."""
    t = df.copy()
    t[header] = [format_ci(*v) for v in zip(t[metric], t[f"{metric}_lo"], t[f"{metric}_hi"], t[n])]
    return t.drop(columns=[metric, f"{metric}_lo", f"{metric}_hi", n])


def build_sections(d: ReportData, save, deploy_links: list[str] = ()) -> tuple[list[Section], list[str]]:
    """Lay the report out; `save(fig, name) -> None` writes a figure; `deploy_links`: engine/schedule files
    written beside the report (relative paths). Returns (sections, notes)."""
    notes: list[str] = []
    ci = f"{MEDIAN_CI_METHOD}, 95%"

    def add_fig(sec: Section, res, name: str, caption: str):
        fig, note = res
        if note:
            sec.notes.append(note)
            notes.append(note)
        if fig is not None:
            save(fig, name)
            sec.figures.append((name, caption))

    sections = [
        Section(
            "Summary",
            text=[
                "Per setting: acceptance = Σaccepted/Σγ; E[N] = mean(accepted+1); tokens/s = Σ new tokens / Σ wall time "
                "of the paired requests. Latency speedup: per request, (AR wall time per token) / (speculative wall time "
                "per token), end to end (prefill included), geometric mean over repeats, median over prompts. Throughput "
                "speedup: per batch, speculative batch tokens/s / AR batch tokens/s (a batch's wall = its slowest row), "
                f"median over batches. CIs: {ci}; n beside each ('[–]': too few for a 95% CI, n < 6)."
            ],
            pre=[format_summary(d.summary)],
        )
    ]

    s = Section(
        "Recommendations",
        text=[
            "Best measured setting per workload and batch size (largest median end-to-end latency speedup among "
            "the measurably faster ones, when any is). verdict: "
            "'faster' if the whole 95% CI lies above 1×. model γ*: the cost model's optimal γ for that draft "
            f"(1..{d.gamma_max}) at the requests' decode length, and its predicted decode speedup."
        ],
    )
    if len(d.recommendations):
        r = _with_ci(d.recommendations, "latency_speedup", "n_prompts", "latency speedup [95% CI] n prompts")
        s.tables.append(
            ("", r.rename(columns={"model_gamma": "model γ*", "model_speedup": "model S(γ*)", "gamma": "γ"}))
        )
    else:
        s.notes.append("no recommendations: no paired speculative requests")
    sections.append(s)

    s = Section(
        "Acceptance",
        text=[
            "α_i = P(accepted ≥ i | accepted ≥ i−1), counted over rounds that drafted position i. E[N] uses "
            "accepted+1 (not committed, which is truncated at EOS/max_new_tokens). Single-α model: "
            "E[N] = (1−α^{γ+1})/(1−α) with the MLE α = Σaccepted / Σ(accepted + [accepted<γ]); per-position "
            "model: E[N] = 1 + Σ_i Π_{j≤i} α_j. Which model to use is decided out of sample: 5-fold cross-validated "
            "log-likelihood of held-out rounds (folds by prompt), so extra parameters only win if they predict."
        ],
    )
    if d.has_spec:
        add_fig(
            s, plots.plot_acceptance(d.acceptance), "acceptance_by_position.png", "Per-position acceptance with 95% CI."
        )
        if d.acceptance_by_category is not None:
            add_fig(
                s,
                plots.plot_acceptance(d.acceptance_by_category),
                "acceptance_by_category.png",
                "Per-position acceptance with 95% CI, per prompt category.",
            )
        add_fig(
            s,
            plots.plot_accept_length(d.accept_length),
            "accept_length_vs_gamma.png",
            "E[N] vs γ: measured vs the two acceptance models (fitted in sample).",
        )
        a = d.acceptance.copy()
        a["α_i [95% CI]"] = [
            f"{x:.3f} [{lo:.3f}, {hi:.3f}]" if t else "–"
            for x, lo, hi, t in zip(a["alpha"], a["alpha_lo"], a["alpha_hi"], a["trials"])
        ]
        a = a.drop(columns=["successes", "alpha", "alpha_lo", "alpha_hi"])
        s.tables.append(("Per-position acceptance", drop_constant_keys(a)))
        s.tables.append(("Single-α fit", d.single_alpha))
        s.tables.append(
            (
                "Which acceptance model predicts held-out rounds better (cross-validated log-likelihood per round)",
                drop_constant_keys(d.model_choice),
            )
        )
    else:
        s.notes.append("no speculative rounds in this sweep")
    sections.append(s)

    s = Section(
        "Component costs",
        text=[
            "One observation per round (times are shared by a round's batch rows), full-batch rounds where there "
            "are at least 3. C_d(γ) = intercept + per-token·γ (least squares through the per-γ medians); C_t(k) = "
            "monotone (isotonic) fit of the median time per k, interpolated between tried k and extrapolated "
            "linearly beyond; C_o = median per γ (linear fit for untried γ); C_t1 = median AR time per token. "
            "Hardware limit: a decode step reads every weight once, so weight bytes ÷ the streaming bandwidth "
            "measured in the job (one k = 1 linear over a 256 MiB matrix) is the floor under C_t1 and under one "
            "draft step (weights only: KV-cache reads come on top); ratios far above 1 mean overhead, not memory. "
            "The own read floors divide each model's weight bytes by the best read of its parameters where they "
            "lie (a fresh buffer's pages can read faster or slower); a compiled step reads its fused q/k/v and "
            "gate/up weights from copies made at compile time, so it can come in under this floor."
        ],
    )
    if d.has_spec:
        add_fig(s, plots.plot_cost_breakdown(d.rounds), "cost_breakdown.png", "Stacked C_d / C_t / C_o per round vs γ.")
        s.tables.append(("Fitted timing profiles (seconds)", drop_constant_keys(d.timing)))
        if len(d.hardware_limit):
            s.tables.append(("Hardware limit", hardware_limit_view(d.hardware_limit)))
    add_fig(s, plots.plot_ct(*ct_points(d.rounds, d.ct)), "ct_k.png", "Target forward time C_t(k) per batch size.")
    sections.append(s)

    s = Section(
        "Speedup model",
        text=[
            "S(γ) = T(γ)·C_t1 / (C_d(γ) + C_t(γ+1) + C_o(γ)); ideal: C_o = 0. T(γ) is the expected tokens committed "
            "per round by a request of the measured decode length: E[N] less the tokens its last round accepts past "
            "max_new_tokens (it tends to E[N] for long outputs). Model-vs-measured comparisons use the decode-phase "
            "latency speedup ((wall − TTFT)/(new tokens − 1)), which is what the model describes. Leave-one-γ-out: "
            "each γ is predicted from the other γ jobs' rows only (their rounds, AR rows and C_t micro-benchmark "
            "rows; the held-out jobs' own C_t rows are excluded)."
        ],
    )
    if d.has_spec:
        add_fig(
            s,
            plots.plot_speedup(d.svm, d.curves),
            "speedup_vs_gamma.png",
            "Decode latency speedup vs γ: measured (median, 95% CI), model, ideal.",
        )
        s.tables.append(
            (
                "Measured vs predicted (rel_error = predicted/measured − 1)",
                drop_constant_keys(
                    _with_ci(d.svm, "latency_speedup", "n_prompts", "measured latency speedup [95% CI] n prompts")
                ),
            )
        )
        if d.loo.empty:
            s.notes.append("leave-one-out: needs at least two γ settings per setting")
        else:
            s.tables.append(
                (
                    "Leave-one-γ-out predictions",
                    drop_constant_keys(
                        _with_ci(d.loo, "latency_speedup", "n_prompts", "measured latency speedup [95% CI] n prompts")
                    ),
                )
            )
            s.tables.append(
                ("Leave-one-out |relative error|: simple vs context-length model", drop_constant_keys(d.context))
            )
    sections.append(s)

    if len(d.head_to_head):
        s = Section(
            "Decoders head to head",
            text=[
                "Decoders interleaved in the same job (`extra_decoders`): same prompts, seeds and alternating order. "
                "Latency speedup of `decoder` over `versus`, per prompt (end-to-end time per token), median over "
                "prompts with its exact CI and n."
            ],
        )
        hh = _with_ci(d.head_to_head, "latency_speedup", "n_prompts", "decoder over versus [95% CI] n")
        s.tables.append(("", drop_constant_keys(hh, tuple(k for k in SETTING_KEYS if k != "decoder"))))
        sections.append(s)

    s = Section("Throughput vs batch size")
    if len(d.latency):
        add_fig(
            s,
            plots.plot_tokens_per_second(d.latency, d.throughput),
            "tokens_per_second.png",
            "Tokens/s vs batch size: per request and per batch.",
        )
    else:
        s.notes.append("no paired requests")
    sections.append(s)

    sections.append(serving_section(d.serving, drop_constant_keys, add_fig))
    sections.append(memory_section(d.kv, d.peak_memory, drop_constant_keys))
    if d.schedules or d.schedule_note:
        sections.append(schedule_section(d.schedules, d.schedule_note, list(deploy_links)))
    if len(d.context_sweep):
        s = Section(
            "Context length",
            text=[
                "Jobs of one setting and γ ran at several context lengths (a job's level: its requests' median prompt "
                "tokens). Measured per level: single α, median C_d per drafted token, C_t(1) (AR step), C_t(γmax+1), "
                "and the γ with the best decode-phase latency speedup. Model: the context variant (C_t(k) + β·L, "
                "C_d = a + γ(b + c·L), C_t1(L)) fitted on all levels, evaluated at the level's mean round context L; "
                "α has no context term (pooled), so where measured α moves, the model's γ* cannot follow."
            ],
        )
        add_fig(
            s,
            plots.plot_context(d.context_sweep),
            "context_length.png",
            "Costs, α and the best γ vs context length: measured vs model.",
        )
        s.tables.append(("Measured vs model per context level", drop_constant_keys(d.context_sweep)))
        sections.append(s)
    return sections, notes


def save_png(out_dir: Path, dpi: int):
    """A `save(fig, name)` that writes PNGs into out_dir."""

    def save(fig, name: str) -> None:
        fig.savefig(out_dir / name, dpi=dpi, format="png")

    return save

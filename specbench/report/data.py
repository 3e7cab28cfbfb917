"""Every table of a report, computed once from the raw rows (`ReportData`), and the report's header."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from specbench.analysis.accept_models import compare_accept_length_models, which_accept_length_model
from specbench.analysis.acceptance import acceptance_by_position, fit_alpha
from specbench.analysis.floor import hardware_limit
from specbench.analysis.rows import (
    ACCEPTANCE_KEYS,
    SETTING_KEYS,
    add_gamma_setting,
    group_keys,
    iter_groups,
    setting_keys,
    spec_rows,
)
from specbench.analysis.speedup import (
    head_to_head,
    latency_speedup,
    paired_requests,
    predict_speedup,
    throughput_speedup,
)
from specbench.analysis.summary import recommendations, summary_table
from specbench.analysis.timing import timing_table
from specbench.analysis.validation import compare_context_model, fit_setting_profiles, leave_one_out, speedup_vs_model
from specbench.deploy.schedule import Schedule
from specbench.report import plots
from specbench.report.context import context_levels, context_table, with_context
from specbench.report.serving_view import (
    compute_schedules,
    kv_table,
    peak_memory_table,
    serving_tables,
)

_FINE_KEYS = (*SETTING_KEYS, "max_new_tokens", "gamma")


@dataclass
class ReportData:
    """Every table of a report, computed once (the measured speedups feed the summary,
    recommendations, model checks and plots alike)."""

    rounds: pd.DataFrame
    requests: pd.DataFrame
    ct: pd.DataFrame | None
    gamma_max: int
    has_spec: bool = False
    latency: pd.DataFrame = field(default_factory=pd.DataFrame)  # wall basis, by _FINE_KEYS
    latency_decode: pd.DataFrame = field(default_factory=pd.DataFrame)  # decode basis, by setting + γ
    throughput: pd.DataFrame = field(default_factory=pd.DataFrame)  # by _FINE_KEYS
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    recommendations: pd.DataFrame = field(default_factory=pd.DataFrame)
    acceptance: pd.DataFrame = field(default_factory=pd.DataFrame)
    acceptance_by_category: pd.DataFrame | None = None
    accept_length: pd.DataFrame = field(default_factory=pd.DataFrame)
    model_choice: pd.DataFrame = field(default_factory=pd.DataFrame)
    single_alpha: pd.DataFrame = field(default_factory=pd.DataFrame)
    timing: pd.DataFrame = field(default_factory=pd.DataFrame)
    hardware_limit: pd.DataFrame = field(default_factory=pd.DataFrame)  # measured costs vs weight-streaming floors
    svm: pd.DataFrame = field(default_factory=pd.DataFrame)
    curves: dict = field(default_factory=dict)
    loo: pd.DataFrame = field(default_factory=pd.DataFrame)
    context: pd.DataFrame = field(default_factory=pd.DataFrame)  # LOO error: simple vs context model
    serving: dict[str, pd.DataFrame] = field(default_factory=dict)  # `serving_view.serving_tables`
    kv: pd.DataFrame = field(default_factory=pd.DataFrame)
    peak_memory: pd.DataFrame = field(default_factory=pd.DataFrame)
    schedules: dict[str, list[Schedule]] = field(default_factory=dict)  # metric -> schedules (>= 2 batch sizes)
    schedule_note: str | None = None
    context_sweep: pd.DataFrame = field(default_factory=pd.DataFrame)  # per context level: measured vs model
    head_to_head: pd.DataFrame = field(default_factory=pd.DataFrame)  # decoders of one job against each other

    @classmethod
    def compute(
        cls, rounds, requests, ct=None, *, gamma_max: int = 16, meta: pd.DataFrame | None = None, floor=None
    ) -> ReportData:
        """All tables from the raw rows (`ct`: the C_t(k) micro-benchmark rows or None; `meta`: job meta rows,
        read for the peak-memory hook only; `floor`: the weight-streaming probe rows or None)."""
        rounds, requests = add_gamma_setting(rounds, requests)
        d = cls(rounds, requests, ct, gamma_max, has_spec=not spec_rows(rounds).empty)
        d.serving = serving_tables(rounds, requests, d.has_spec)
        d.kv = kv_table(requests)
        d.peak_memory = peak_memory_table(requests, meta)
        d.schedules, d.schedule_note = compute_schedules(requests)
        fine = group_keys(requests, None, _FINE_KEYS)
        if len(paired_requests(requests)):
            d.latency = latency_speedup(requests, fine, basis="wall")
            if "batch" in requests.columns:
                d.throughput = throughput_speedup(requests, fine)
            d.head_to_head = head_to_head(requests, [k for k in fine if k != "decoder"] + ["decoder"])
        d.summary = summary_table(
            rounds,
            requests,
            fine,
            latency=d.latency if len(d.latency) else None,
            throughput=d.throughput if len(d.throughput) else None,
        )
        if not d.has_spec:
            return d
        d.recommendations = recommendations(
            rounds, requests, ct, gamma_max=gamma_max, measured=d.latency if len(d.latency) else None
        )
        d.acceptance = acceptance_by_position(rounds)
        if "category" in rounds and rounds["category"].nunique() > 1:  # one workload, several kinds of traffic
            d.acceptance_by_category = acceptance_by_position(rounds, by=[*ACCEPTANCE_KEYS, "category"])
        d.accept_length = compare_accept_length_models(rounds)
        d.model_choice = which_accept_length_model(rounds)
        sp = spec_rows(rounds)
        singles = []
        for kd, sub in iter_groups(sp, plots.varying(sp, ACCEPTANCE_KEYS)):
            f = fit_alpha(sub)
            singles.append({**kd, "α (single)": f.alpha, "lo": f.lo, "hi": f.hi, "tested positions": f.trials})
        d.single_alpha = pd.DataFrame(singles)
        d.timing = timing_table(rounds, ct)
        d.hardware_limit = hardware_limit(d.timing, floor)
        skeys = setting_keys(rounds, None)
        d.latency_decode = latency_speedup(requests, skeys + ["gamma"], basis="decode")
        d.svm = speedup_vs_model(rounds, requests, ct, gamma_max=gamma_max, measured=d.latency_decode)
        vary = plots.varying(d.svm, SETTING_KEYS)
        gm = int(max(d.svm["gamma"].max() + 2, 8)) if len(d.svm) else gamma_max
        for kd, acc, tim in fit_setting_profiles(rounds, ct):
            key = tuple(sorted((k, str(v)) for k, v in kd.items() if k in vary))
            d.curves[key] = predict_speedup(acc, tim, range(1, gm + 1))
        d.loo = leave_one_out(rounds, requests, ct, measured=d.latency_decode)
        if len(d.loo):
            d.context = compare_context_model(rounds, requests, ct, simple=d.loo, measured=d.latency_decode)
        levels = context_levels(requests)
        if levels is not None and "job" in rounds.columns:
            d.context_sweep = context_table(
                with_context(rounds, levels), with_context(requests, levels), ct, gamma_max=gamma_max
            )
        return d

    def tables(self) -> dict[str, pd.DataFrame]:
        """The tables a script would consume (written as report/tables/<name>.csv and .json)."""
        out = {
            "summary": self.summary,
            "recommendations": self.recommendations,
            "latency_speedup": self.latency,
            "throughput_speedup": self.throughput,
            "head_to_head": self.head_to_head,
            "acceptance_by_position": self.acceptance,
            "speedup_vs_model": self.svm,
            "timing": self.timing,
            "hardware_limit": self.hardware_limit,
            "kv_bytes": self.kv,
            "peak_memory": self.peak_memory,
            "context_sweep": self.context_sweep,
            **self.serving,
        }
        for metric, sched in self.schedules.items():
            out[f"schedule_{metric}"] = pd.concat([x.to_frame() for x in sched], ignore_index=True)
        return {k: v for k, v in out.items() if v is not None and len(v)}


def report_meta(d: ReportData) -> dict:
    """The report header line: what was measured, where, and how C_t was obtained."""
    r = d.rounds
    meta = {
        "jobs": int(r["job"].nunique()) if "job" in r.columns else 1,
        "round rows": len(r),
        "requests": len(d.requests),
        "hardware": ", ".join(map(str, sorted(r["hardware"].dropna().unique()))) if "hardware" in r else "–",
        "C_t source": "micro-benchmark table" if d.ct is not None and len(d.ct) else "rounds (fallback)",
    }
    if "shape_only" in r and r["shape_only"].astype(bool).any():
        meta["shape-only models"] = "random weights: timings are real, acceptance and speedups are NOT meaningful"
    return meta

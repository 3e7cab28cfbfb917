"""Recommendations: per study, the best arm (draft, γ, and the draft-length policy with its tau), both
measured speedups with CIs, the reference throughput, the alternatives a paired test cannot tell apart
from it, and the best policy against the best fixed γ, paired (`policy_compare`).

Everything is recomputed from the request rows stored with each trial (`paired.expand`).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from optuna.trial import TrialState

from specbench.analysis.speedup import deploy_label, latency_speedup, speedup_verdict, throughput_speedup
from specbench.bench import runstore
from specbench.tune.objectives import OBJECTIVES, is_better
from specbench.tune.paired import batch_speedups, expand, objective_value, paired_p, reference_throughput
from specbench.tune.policy_compare import COLUMNS as COMPARE_COLUMNS
from specbench.tune.policy_compare import format_cell, policy_vs_fixed
from specbench.tune.samplers import Arm, config_of

REC_COLUMNS = [
    "workload",
    "categories",
    "batch_size",
    "sampling",
    "draft",
    "gamma",
    "policy",
    "tau",
    "throughput_speedup",
    "throughput_speedup_lo",
    "throughput_speedup_hi",
    "latency_speedup",
    "latency_speedup_lo",
    "latency_speedup_hi",
    "verdict",
    "deploy",
    "tok_s",
    "ar_tok_s",
    "objective",
    "objective_value",
    "n_trials",
    "n_complete",
    "n_pruned",
    "n_batches",
    "model_gamma",
    "model_speedup",
    "indistinguishable",
    "decode_s",
    "study",
    *COMPARE_COLUMNS,
]


def trial_requests(trial) -> pd.DataFrame:
    """The request rows a trial stored (user attribute `requests`), with job = trial-NNNN."""
    return expand(trial.user_attrs.get("requests"), f"trial-{trial.number:04d}")


def pooled(study, states=(TrialState.COMPLETE,)) -> dict[Arm, pd.DataFrame]:
    """Per arm (draft, γ, policy, tau): the request rows of all its trials in `states` (COMPLETE)."""
    out: dict[Arm, list[pd.DataFrame]] = {}
    for t in study.get_trials(deepcopy=False, states=states):
        c = config_of(t)
        if c is not None:
            out.setdefault(c, []).append(trial_requests(t))
    return {c: pd.concat(frames, ignore_index=True) for c, frames in out.items()}


def decode_seconds(study) -> float:
    """Measurement time spent on a study: Σ decode wall times of its profile and all trials."""
    model = study.user_attrs.get("model") or {}
    trials = study.get_trials(deepcopy=False)
    return float(model.get("decode_s") or 0.0) + sum(float(t.user_attrs.get("decode_s") or 0.0) for t in trials)


def recommend(study, confidence: float = 0.95) -> dict | None:
    """One recommendation row of a study (None without a complete trial).

    Chosen: the best objective over each configuration's pooled complete trials. Alternatives
    are paired with it batch by batch (`paired.paired_p`: Wilcoxon signed-rank on per-batch log
    ratios of the objective's speedup); p ≥ 1 - confidence reads "indistinguishable". `ar_tok_s`
    is the study's AR batch throughput over every finished trial (Σ batch tokens ÷ Σ batch walls).
    """
    ua = study.user_attrs
    objective = ua.get("objective", "throughput")
    obj = OBJECTIVES.get(objective, "tune.objective")
    reference = ua.get("reference") or {}
    by_config = pooled(study)
    if not by_config:
        return None
    values = {c: objective_value(q, objective, reference) for c, q in by_config.items()}
    best = None
    for c, v in values.items():
        if best is None or is_better(v, values[best], objective):
            best = c
    if not math.isfinite(values[best]):
        return None
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    best_q = by_config[best]
    thr = throughput_speedup(best_q, by=[], confidence=confidence).iloc[0]
    lat = latency_speedup(best_q, by=[], confidence=confidence).iloc[0]
    ar_tok_s = reference_throughput(pd.concat([trial_requests(t) for t in finished], ignore_index=True))
    best_b = batch_speedups(best_q, objective)
    alts = []
    for c, q in by_config.items():
        if c == best:
            continue
        p = paired_p(best_b, batch_speedups(q, objective))
        if math.isfinite(p) and p >= 1.0 - confidence:
            alts.append({"draft": c.draft, "gamma": c.gamma, "arm": c, "p": p, "value": values[c]})
    alts.sort(key=lambda a: -a["p"])
    multi_draft = len({c[0] for c in by_config}) > 1
    model = ua.get("model") or {}
    shown = thr if obj.speedup == "throughput_speedup" else lat
    return {
        "workload": ua.get("workload"),
        "categories": ua.get("categories"),
        "batch_size": ua.get("batch_size"),
        "sampling": ua.get("sampling"),
        "draft": best.draft,
        "gamma": best.gamma,
        "policy": best.policy,
        "tau": best.tau,
        **{k: float(thr[k]) for k in ("throughput_speedup", "throughput_speedup_lo", "throughput_speedup_hi")},
        **{k: float(lat[k]) for k in ("latency_speedup", "latency_speedup_lo", "latency_speedup_hi")},
        "verdict": speedup_verdict(shown[f"{obj.speedup}_lo"], shown[f"{obj.speedup}_hi"]),
        "deploy": deploy_label(best[1], shown[f"{obj.speedup}_lo"], shown[f"{obj.speedup}_hi"]),
        "tok_s": float(thr["throughput_speedup"]) * ar_tok_s,
        "ar_tok_s": ar_tok_s,
        "objective": objective,
        "objective_value": values[best],
        "n_trials": len(finished),
        "n_complete": sum(t.state == TrialState.COMPLETE for t in finished),
        "n_pruned": sum(t.state == TrialState.PRUNED for t in finished),
        "n_batches": int(thr["n_batches"]),
        "model_gamma": model.get("gamma"),
        "model_speedup": model.get("speedup"),
        "indistinguishable": "; ".join(_alt_label(a, best, multi_draft) for a in alts),
        "decode_s": decode_seconds(study),
        "study": study.study_name,
        **_policy_vs_fixed(study, objective, reference, confidence),
        "alternatives": alts,
    }


def _policy_vs_fixed(study, objective: str, reference: dict, confidence: float) -> dict:
    """The best policy arm against the best fixed-γ arm; pruned trials count on the batches they measured
    (a policy the pruner stopped early was still paired batch by batch)."""
    arms = pooled(study, (TrialState.COMPLETE, TrialState.PRUNED))
    return policy_vs_fixed(
        arms, {c: objective_value(q, objective, reference) for c, q in arms.items()}, objective, confidence
    )


def _alt_label(a: dict, best: Arm, multi_draft: bool) -> str:
    return f"{best.label(multi_draft)} ≈ {a['arm'].label(multi_draft)} (p={a['p']:.2f})"


def recommendation_table(studies, confidence: float = 0.95) -> pd.DataFrame:
    """The recommendation table (REC_COLUMNS) over studies; `alternatives` kept as a list column."""
    rows = [r for s in studies if (r := recommend(s, confidence)) is not None]
    return pd.DataFrame(rows, columns=REC_COLUMNS + ["alternatives"])


def _arm(r) -> Arm:
    """A recommendation row's arm (pandas holds a missing policy / tau as None or NaN)."""
    tau = r.tau if isinstance(r.tau, float) and math.isfinite(r.tau) else None
    return Arm(r.draft, int(r.gamma), r.policy if isinstance(r.policy, str) else None, tau)


def _ci(s: float, lo: float, hi: float) -> str:
    return f"{s:.2f}× [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) else f"{s:.2f}×"


def format_table(df: pd.DataFrame) -> str:
    """Markdown table of the recommendations (both speedups named, with their CIs); `deploy` is `off`
    (plain decoding, γ = 0) unless the best measured setting is significantly faster."""
    if df.empty:
        return "(no complete trials)"
    lines = [
        "| workload | batch | sampling | deploy | best draft | best γ [policy] | throughput speedup [CI] | latency speedup [CI] "
        "| tok/s | trials (pruned) | model γ | indistinguishable | best policy / best fixed γ, paired [CI] |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in df.iterrows():
        thr = _ci(r.throughput_speedup, r.throughput_speedup_lo, r.throughput_speedup_hi)
        lat = _ci(r.latency_speedup, r.latency_speedup_lo, r.latency_speedup_hi)
        lines.append(
            f"| {r.workload}[{r.categories}] | {r.batch_size} | {r.sampling} | {r.deploy} | {r.draft} | {_arm(r).label(False)} | {thr} | "
            f"{lat} | {r.tok_s:.1f} | {r.n_trials} ({r.n_pruned}) | {r.model_gamma} | {r.indistinguishable or '-'} "
            f"| {format_cell(r)} |"
        )
    return "\n".join(lines)


def write_recommendations(df: pd.DataFrame, out_dir: Path) -> Path:
    """recommendations.{csv,json,md} in `out_dir`; returns the markdown path."""
    out_dir = Path(out_dir)
    runstore.write_text(out_dir, "recommendations.csv", df.drop(columns=["alternatives"]).to_csv(index=False))
    runstore.write_json(out_dir, "recommendations", df.to_dict(orient="records"))
    runstore.write_text(out_dir, "recommendations.md", format_table(df) + "\n")
    return out_dir / "recommendations.md"

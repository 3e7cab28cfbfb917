"""The cost model's (draft, γ) for a new study, and the study's frozen reference AR figures.

Per draft: fit `specbench.analysis`'s acceptance and timing profiles on a prior sweep's
matching rows (``tune.prior_sweep``), else on a short profile run through the benchmark
protocol (`profile_batches` batches at γ = `profile_gamma`, paired with the baseline), plus
a C_t(k) micro-benchmark; then the speedup model's optimal γ. The reference throughput is
the batch-wall definition in every branch (`paired.reference_throughput`).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import pandas as pd

from specbench.analysis.acceptance import AcceptanceProfile
from specbench.analysis.policy_model import choose_tau, fit_accept_curve
from specbench.analysis.rows import ar_mask
from specbench.analysis.speedup import optimal_gamma, predict_speedup
from specbench.analysis.timing import TimingProfile
from specbench.bench import runstore
from specbench.config import Config
from specbench.tune.paired import reference_latency, reference_throughput
from specbench.tune.samplers import TAUS, policy_choices, reads_tau
from specbench.tune.study import StudySpec

if TYPE_CHECKING:
    from specbench.tune.runner import Runner

log = logging.getLogger("specbench.tune")


def fit_prediction(rounds: pd.DataFrame, gamma_max: int, ct: pd.DataFrame | None = None) -> tuple[int, float, dict]:
    """(model-optimal γ, its predicted speedup, fit details with the {γ: predicted} `curve`) from
    the round rows of one setting (speculative + AR) and optional C_t(k) rows."""
    acc = AcceptanceProfile.from_rounds(rounds)
    tim = TimingProfile.from_rounds(rounds, ct, context=False)
    pred = predict_speedup(acc, tim, range(1, gamma_max + 1))
    curve = {
        str(int(g)): (float(s) if math.isfinite(s) else None) for g, s in zip(pred["gamma"], pred["predicted_speedup"])
    }
    g, s = optimal_gamma(acc, tim, gamma_max)
    return (
        int(g),
        float(s),
        {
            "curve": curve,
            "alpha": float(acc.alpha),
            "ct1": float(tim.ct1),
            "cd_per_token": float(tim.cd_per_token),
            "ct_k": tim.ct_k,
            "ct_t": tim.ct_t,
            "ct_source": tim.ct_source,
        },
    )


def policy_taus(rounds: pd.DataFrame, ct: pd.DataFrame | None, gamma: int, policies: list[str] | None) -> dict:
    """The cost model's tau* for each threshold policy searched, replayed on the profile's recorded draft
    confidences (`analysis.policy_model.choose_tau`); {} without such a policy or without confidences."""
    names = [p for p in policy_choices(policies) or [] if reads_tau(p)]
    if not names:
        return {}
    try:
        curve = fit_accept_curve(rounds)
        tim = TimingProfile.from_rounds(rounds, ct, context=False)
        return {
            p: float(choose_tau(rounds, curve, tim, p, TAUS, gamma, draft_stops=True).iloc[0]["tau"]) for p in names
        }
    except (ValueError, KeyError) as exc:
        log.warning("tau* not modelled (%s): the search starts its policies at tau 0.5", exc)
        return {}


def prior_rows(cfg: Config, spec: StudySpec, draft: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Round and request rows of a prior sweep that match this study (pair, batch size, sampling,
    categories; round rows also the draft kind, or AR)."""
    rounds = runstore.load_sweep(cfg.tune.prior_sweep, "rounds")
    requests = runstore.load_sweep(cfg.tune.prior_sweep, "requests")
    sel = {"batch_size": spec.batch_size, "sampling": cfg.sampling.name, "pair": cfg.pair.name}
    cats = {p.category for p in spec.prompts}

    def match(df: pd.DataFrame, with_draft: bool) -> pd.DataFrame:
        m = pd.Series(True, index=df.index)
        for k, v in sel.items():
            if k in df.columns:
                m &= df[k] == v
        if "category" in df.columns:
            m &= df["category"].isin(cats)
        if with_draft and "draft_kind" in df.columns:
            m &= (df["draft_kind"] == draft) | ar_mask(df)
        return df[m]

    return match(rounds, True), match(requests, False)


def prior_ct(sweep_dir: str) -> pd.DataFrame | None:
    """The prior sweep's C_t(k) micro-benchmark rows (jobs with ct_bench=true), or None."""
    try:
        return runstore.load_sweep(sweep_dir, "ct")
    except (FileNotFoundError, ValueError):
        return None


def _from_prior(cfg: Config, spec: StudySpec, draft: str):
    """(rounds, AR requests at this max_new_tokens, ct) of a prior sweep, or None when it has no match."""
    t = cfg.tune
    try:
        r, q = prior_rows(cfg, spec, draft)
    except (FileNotFoundError, ValueError) as exc:
        log.warning("prior sweep %s unusable (%s); profiling instead", t.prior_sweep, exc)
        return None
    if not (len(r[~ar_mask(r)]) and len(r[ar_mask(r)])):
        log.warning(
            "prior sweep %s has no rows for draft=%s, batch_size=%d, sampling=%s, categories=%s; profiling instead",
            t.prior_sweep,
            draft,
            spec.batch_size,
            cfg.sampling.name,
            spec.categories,
        )
        return None
    qa = q[ar_mask(q)]
    if "max_new_tokens" in qa.columns:
        qa = qa[qa["max_new_tokens"] == cfg.max_new_tokens]
    return r, qa, prior_ct(t.prior_sweep)


def model_choice(cfg: Config, spec: StudySpec, runner: Runner) -> tuple[dict, dict]:
    """(model, reference): the cost model's (draft, γ) with its fits and predictions, and the
    reference AR figures (`ar_tok_s`, `ar_latency`). Profile rows and C_t(k) rows are written
    to the run store beside the study's trials."""
    t = cfg.tune
    model: dict = {"source": None, "prediction": {}, "fits": {}, "decode_s": 0.0}
    ar_requests: list[pd.DataFrame] = []
    best: tuple | None = None
    for draft in spec.drafts:
        prior = _from_prior(cfg, spec, draft) if t.prior_sweep else None
        if prior is not None:
            rounds, qa, ct = prior
            model["source"] = f"prior_sweep:{t.prior_sweep}"
            ar_requests.append(qa)
        else:
            model["source"] = model["source"] or "profile"
            n = min(t.profile_max_new_tokens or cfg.max_new_tokens, cfg.max_new_tokens)
            m = runner.new_measurement()
            runner.warmup(draft, spec.batches)
            for i, batch in enumerate(spec.batches[: t.profile_batches]):
                runner.measure(m, draft, t.profile_gamma, spec, i, batch, 0, n)
            runner.record(spec, f"profile-{draft}", m, {"study": spec.name, "kind": "profile", "draft": draft})
            model["decode_s"] += m.decode_s
            rounds, requests = m.rounds_frame(), m.requests_frame(job=f"profile-{draft}")
            ar_requests.append(requests[ar_mask(requests)])
            ct = None
        if ct is None and t.profile_ct:
            ct = runner.bench_ct(draft, spec, range(1, t.gamma_max + 2))
            runner.record_ct(spec, f"profile-ct-{draft}", ct)
            model["decode_s"] += float(ct["t_forward"].sum())
        try:
            g, s, fit = fit_prediction(rounds, t.gamma_max, ct)
        except (ValueError, KeyError) as exc:
            log.warning("cost model fit failed for draft=%s (%s); falling back to γ=%d", draft, exc, t.profile_gamma)
            g, s, fit = min(t.profile_gamma, t.gamma_max), math.nan, {"curve": {}}
        if g < 1:
            g = min(t.profile_gamma, t.gamma_max)
        model["prediction"][draft] = fit.pop("curve")
        taus = policy_taus(rounds, ct, t.profile_gamma, t.policies)
        model["fits"][draft] = {**fit, "gamma": g, "speedup": s if math.isfinite(s) else None, "tau_star": taus}
        if best is None or (math.isfinite(s) and (not math.isfinite(best[2]) or s > best[2])):
            best = (draft, g, s)
    model["draft"], model["gamma"] = best[0], int(best[1])
    model["speedup"] = best[2] if math.isfinite(best[2]) else None
    ar = pd.concat(ar_requests, ignore_index=True)
    tok_s, lat = (reference_throughput(ar), reference_latency(ar)) if len(ar) else (math.nan, math.nan)
    return model, {
        "ar_tok_s": tok_s if math.isfinite(tok_s) else None,
        "ar_latency": lat if math.isfinite(lat) else None,
    }

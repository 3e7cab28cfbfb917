"""Speedups: the cost model's prediction S(γ), and the two measured speedups, defined once.

* **latency speedup** (per request): AR time per token ÷ speculative time per token of the
  same prompt and repeat; geometric mean over repeats per prompt, median over prompts.
* **throughput speedup** (per batch): speculative batch tokens/s ÷ AR batch tokens/s of the
  same batch and repeat (a batch's rows start together; its wall is its slowest row's);
  median over batches.
Both CIs are the exact order-statistic CI of the median (`stats.median_ci`), with n beside them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from specbench.analysis.acceptance import AcceptanceProfile
from specbench.analysis.rows import (
    SETTING_KEYS,
    baseline_column,
    decode_phase,
    decoder_column,
    group_keys,
    iter_groups,
    plain_mask,
)
from specbench.analysis.stats import median_ci
from specbench.analysis.timing import TimingProfile
from specbench.engines import ENGINES

BASES = ("wall", "decode")
_BATCH_ID = ("job", "decoder", "repeat", "batch")


# --------------------------------------------------------------------------- model


def speedup_formula(accept_length, ct1, cd, ct, co=0.0):
    """S = E[N]·C_t1 / (C_d(γ) + C_t(γ+1) + C_o)."""
    if any(np.ndim(v) for v in (accept_length, ct1, cd, ct, co)):
        accept_length, ct1, cd, ct, co = (np.asarray(v, float) for v in (accept_length, ct1, cd, ct, co))
    return accept_length * ct1 / (cd + ct + co)


def ideal_speedup(accept_length, ct1, cd, ct):
    """S with C_o = 0: E[N]·C_t1 / (C_d(γ) + C_t(γ+1))."""
    return speedup_formula(accept_length, ct1, cd, ct, 0.0)


def break_even_draft_cost(accept_length, ct1, ct, co, drafted):
    """`speedup_formula` solved for the draft at S = 1, per drafted token: C_d = (E[N]·C_t1 − C_t(γ+1) − C_o) / d
    with C_d(γ) = d·C_d; 0 where the verify and overhead alone cost more than E[N] plain steps; NaN where d = 0."""
    if drafted <= 0:
        return math.nan
    return max(accept_length * ct1 - ct - co, 0.0) / drafted


def predict_speedup(
    acceptance: AcceptanceProfile,
    timing: TimingProfile,
    gammas: Iterable[int],
    *,
    model: str = "positional",
    context_len: float | None = None,
    decode_tokens: int | None = None,
    draft_prefill: float = 0.0,
) -> pd.DataFrame:
    """What-if decode speedup: α_i from one profile, costs from another (e.g. a GPU timing profile).

    `decode_tokens`: tokens a request decodes after its first (max_new_tokens − 1); the last
    round of each request commits only what fits, so tokens per round fall below E[N] at short
    outputs (None: no truncation). `draft_prefill`: seconds the draft's prefill takes in the
    decode phase (after the first token, before the first round; `t_draft_prefill` on request
    rows); with `decode_tokens` it is spread over the request's expected rounds, as `c_prefill`
    per round (without, a long request amortises it to nothing). Columns: gamma, accept_length
    (E[N] of `model`), accept_length_single, accept_length_positional, tokens_per_round, c_d,
    c_t (at k = γ+1), c_o, c_prefill, c_t1, t_round, predicted_speedup, ideal_speedup (C_o = 0;
    the draft's prefill is a cost, not overhead, and stays). With `context_len`, the
    context-length variant of the timings is used (if the timing profile has one).
    """
    rows = []
    for g in gammas:
        g = int(g)
        es = acceptance.accept_length(g, "single")
        ep = acceptance.accept_length(g, "positional")
        tpr = acceptance.tokens_per_round(g, decode_tokens, model)
        cd = timing.c_d(g, context_len)
        ctv = timing.c_t(g + 1, context_len)
        co = timing.c_o(g)
        ct1 = timing.c_t1(context_len)
        # One request = decode_tokens / tokens_per_round rounds: its draft prefill, per round.
        cp = draft_prefill * tpr / decode_tokens if decode_tokens and draft_prefill > 0 else 0.0
        rows.append(
            {
                "gamma": g,
                "accept_length": ep if model == "positional" else es,
                "accept_length_single": es,
                "accept_length_positional": ep,
                "tokens_per_round": tpr,
                "c_d": cd,
                "c_t": ctv,
                "c_o": co,
                "c_prefill": cp,
                "c_t1": ct1,
                "t_round": cd + ctv + co + cp,
                "predicted_speedup": speedup_formula(tpr, ct1, cd, ctv, co + cp),
                "ideal_speedup": speedup_formula(tpr, ct1, cd, ctv, cp),
            }
        )
    return pd.DataFrame(rows)


def optimal_gamma(acceptance: AcceptanceProfile, timing: TimingProfile, gamma_max: int = 16, **kw) -> tuple[int, float]:
    """Model-optimal γ over 1..gamma_max and its predicted speedup (`kw` as `predict_speedup`)."""
    p = predict_speedup(acceptance, timing, range(1, gamma_max + 1), **kw)
    if p["predicted_speedup"].isna().all():
        return (0, math.nan)
    r = p.loc[p["predicted_speedup"].idxmax()]
    return (int(r["gamma"]), float(r["predicted_speedup"]))


# --------------------------------------------------------------------------- measured: latency


def speedup_verdict(lo: float, hi: float) -> str:
    """'faster' when the CI lies wholly above 1, 'slower' when wholly below, else 'not significant'
    (a missing CI too). The one rule behind every "off" (γ = 0) recommendation: speculation is
    deployed only when it is measurably faster than plain decoding, whose speedup is 1 by definition."""
    if math.isfinite(lo) and lo > 1:
        return "faster"
    if math.isfinite(hi) and hi < 1:
        return "slower"
    return "not significant"


def best_to_deploy(table: pd.DataFrame, metric: str, tie: str | None = "gamma") -> object:
    """Index of the row to deploy from candidates with `metric`, `metric_lo`, `metric_hi` columns: the
    best point estimate among the rows that are measurably faster (`speedup_verdict` 'faster'), or,
    when none is, the best point estimate overall (whose verdict then says "off"). Ties go to the
    smaller `tie` (γ: less draft work). A γ that is measurably faster is never passed over for one
    whose estimate is a hair higher but whose CI includes 1."""
    values = pd.to_numeric(table[metric], errors="coerce")
    cand = table[np.isfinite(values.to_numpy(float))]
    if cand.empty:
        raise ValueError(f"best_to_deploy: no finite {metric!r} among {len(table)} rows")
    faster = [speedup_verdict(lo, hi) == "faster" for lo, hi in zip(cand[f"{metric}_lo"], cand[f"{metric}_hi"])]
    pool = cand[faster] if any(faster) else cand
    order = [metric, tie] if tie and tie in pool.columns else [metric]
    return pool.sort_values(order, ascending=[False, True][: len(order)], kind="stable").index[0]


def deploy_label(gamma: int, lo: float, hi: float) -> str:
    """What to deploy for a measured best γ: `γ=<g>` when it is faster, else `off` (plain decoding)."""
    return f"γ={int(gamma)}" if speedup_verdict(lo, hi) == "faster" else "off"


def paired_requests(requests: pd.DataFrame, basis: str = "wall", baseline: str | None = None) -> pd.DataFrame:
    """Pair each speculative request with the baseline request of the same job/prompt_id/repeat.

    `baseline` None: each engine's baseline (`specbench.engines.Engine.baseline`: specbench's
    autoregressive for speculative and hf_assisted, llama.cpp's for llama_cpp). Otherwise the name of
    another decoder run in the same job (`extra_decoders`), e.g. 'hf_assisted' for specbench vs
    transformers; the "ar_" columns then hold that decoder's figures.

    basis 'wall': time per token = wall_time / new_tokens (end to end, prefill included);
    basis 'decode': (wall_time − ttft) / (new_tokens − first_chunk_tokens) (decode phase only,
    which is what the cost model describes; see `rows.decode_phase`; empty decode phases are dropped).
    ratio = AR time per token / speculative time per token. Keys are the speculative side's.
    """
    if basis not in BASES:
        raise ValueError(f"basis must be one of {BASES}, got {basis!r}")
    dec = decoder_column(requests)
    on = [c for c in ("job", "prompt_id", "repeat") if c in requests.columns]
    if not on:
        raise ValueError("requests need job/prompt_id/repeat columns to pair decoders")
    plain = plain_mask(requests)
    sp = requests[~plain & (dec != baseline)]
    timed = [c for c in ("new_tokens", "wall_time", "ttft", "first_chunk_tokens") if c in requests.columns]
    if baseline is None:  # each decoder over its own engine's plain decoder
        sp = sp.assign(_baseline=baseline_column(sp))
        ar = requests[plain][on + timed].assign(_baseline=dec[plain])
        keys = on + ["_baseline"]
    else:
        ar, keys = requests[dec == baseline][on + timed], on
    if ar.duplicated(keys).any():
        raise ValueError(f"several baseline requests share {keys}; cannot pair them unambiguously")
    m = sp.merge(ar.rename(columns={c: f"ar_{c}" for c in timed}), on=keys, how="inner").drop(
        columns="_baseline", errors="ignore"
    )

    def tpt(prefix: str) -> pd.Series:
        if basis == "wall":
            new = m[f"{prefix}new_tokens"]
            return m[f"{prefix}wall_time"] / new.where(new > 0)
        seconds, tokens = decode_phase(m, prefix)
        return seconds / tokens

    m["spec_time_per_token"] = tpt("")
    m["ar_time_per_token"] = tpt("ar_")
    m["ratio"] = m["ar_time_per_token"] / m["spec_time_per_token"]
    return m[np.isfinite(m["ratio"]) & (m["ratio"] > 0)].reset_index(drop=True)


def latency_speedup(
    requests: pd.DataFrame, by=None, *, basis: str = "wall", confidence: float = 0.95, baseline: str | None = None
) -> pd.DataFrame:
    """Measured per-request (latency) speedup per group: median over prompts of the per-prompt
    paired ratio (geometric mean over repeats), exact order-statistic CI over prompts.

    `requests` needs a `gamma` column to group by γ (see `add_gamma_setting`). Columns: by +
    [latency_speedup, latency_speedup_lo, latency_speedup_hi, n_prompts, n_pairs, spec_tok_s,
    ar_tok_s] (tok/s = Σ new tokens / Σ wall time over the pairs: a per-request rate; "ar" is
    `baseline`: the decoder's own engine's plain decoder unless another decoder of the job is named).
    """
    pairs = paired_requests(requests, basis, baseline)
    keys = group_keys(pairs, by, (*SETTING_KEYS, "gamma"))
    out = []
    for kd, sub in iter_groups(pairs, keys):
        unit = [c for c in ("job", "decoder", "prompt_id") if c in sub.columns]
        per_prompt = np.exp(np.log(sub["ratio"]).groupby([sub[c] for c in unit]).mean())
        med, lo, hi = median_ci(per_prompt.to_numpy(), confidence)
        out.append(
            {
                **kd,
                "latency_speedup": med,
                "latency_speedup_lo": lo,
                "latency_speedup_hi": hi,
                "n_prompts": len(per_prompt),
                "n_pairs": len(sub),
                "spec_tok_s": float(sub["new_tokens"].sum() / sub["wall_time"].sum()),
                "ar_tok_s": float(sub["ar_new_tokens"].sum() / sub["ar_wall_time"].sum()),
            }
        )
    cols = keys + [
        "latency_speedup",
        "latency_speedup_lo",
        "latency_speedup_hi",
        "n_prompts",
        "n_pairs",
        "spec_tok_s",
        "ar_tok_s",
    ]
    return pd.DataFrame(out, columns=cols)


def head_to_head(requests: pd.DataFrame, by=None, *, basis: str = "wall", confidence: float = 0.95) -> pd.DataFrame:
    """Speculative decoders run in the same jobs (`extra_decoders`), divided by each other per prompt:
    `decoder` over `versus`, same prompts, seeds and interleaving, so no drift between jobs enters.
    Columns: `latency_speedup` table columns + `versus`; empty with fewer than two such decoders."""
    # in registration order, specbench's own decoder first: it is the numerator against every other
    order = ENGINES.names()
    names = sorted(set(decoder_column(requests[~plain_mask(requests)])), key=lambda n: (order + [n]).index(n))
    frames = []
    for versus in names[1:]:
        table = latency_speedup(requests, by, basis=basis, confidence=confidence, baseline=versus)
        frames.append(table.assign(versus=versus))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# --------------------------------------------------------------------------- measured: throughput


def batch_throughput(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per (job, decoder, repeat, batch): tokens = Σ new_tokens, wall = the batch's
    largest wall_time (its rows start together), tok_s = tokens / wall. Other columns that
    are constant within a batch (setting keys, gamma) are kept."""
    ids = [c for c in _BATCH_ID if c in requests.columns]
    if "batch" not in ids:
        raise ValueError(f"requests need a 'batch' column for batch throughput; columns: {sorted(requests.columns)}")
    if requests.empty:
        return pd.DataFrame(columns=ids + ["tokens", "wall", "tok_s"])
    req = requests.assign(decoder=decoder_column(requests))
    ids = [c for c in _BATCH_ID if c in req.columns]
    grouped = req.groupby(ids, dropna=False, sort=True)
    out = grouped.agg(tokens=("new_tokens", "sum"), wall=("wall_time", "max")).reset_index()
    nunique = grouped.nunique(dropna=False).max()
    const = [c for c in req.columns if c not in ids and c in nunique.index and nunique[c] == 1]
    firsts = grouped[const].first().reset_index(drop=True)
    out = pd.concat([out, firsts], axis=1)
    out["tok_s"] = out["tokens"] / out["wall"].where(out["wall"] > 0)
    return out


def throughput_speedup(requests: pd.DataFrame, by=None, *, confidence: float = 0.95) -> pd.DataFrame:
    """Measured batch-throughput speedup per group: per (job, repeat, batch) the paired ratio of
    batch tok/s (speculative ÷ AR), median over batches with an exact order-statistic CI.

    Columns: by + [throughput_speedup, throughput_speedup_lo, throughput_speedup_hi, n_batches,
    spec_tok_s, ar_tok_s] (tok/s = Σ batch tokens / Σ batch wall: an aggregate rate).
    """
    bt = batch_throughput(requests)
    on = [c for c in ("job", "repeat", "batch") if c in bt.columns]
    bt = bt.assign(_baseline=baseline_column(bt))
    plain = plain_mask(bt)
    sp, ar = bt[~plain], bt[plain][on + ["tokens", "wall", "tok_s", "_baseline"]]
    pairs = sp.merge(
        ar.rename(columns={"tokens": "ar_tokens", "wall": "ar_wall", "tok_s": "ar_batch_tok_s"}),
        on=on + ["_baseline"],
        how="inner",
    ).drop(columns="_baseline")
    pairs["ratio"] = pairs["tok_s"] / pairs["ar_batch_tok_s"]
    pairs = pairs[np.isfinite(pairs["ratio"]) & (pairs["ratio"] > 0)]
    keys = group_keys(pairs, by, (*SETTING_KEYS, "gamma"))
    out = []
    for kd, sub in iter_groups(pairs, keys):
        med, lo, hi = median_ci(sub["ratio"].to_numpy(), confidence)
        out.append(
            {
                **kd,
                "throughput_speedup": med,
                "throughput_speedup_lo": lo,
                "throughput_speedup_hi": hi,
                "n_batches": len(sub),
                "spec_tok_s": float(sub["tokens"].sum() / sub["wall"].sum()),
                "ar_tok_s": float(sub["ar_tokens"].sum() / sub["ar_wall"].sum()),
            }
        )
    cols = keys + [
        "throughput_speedup",
        "throughput_speedup_lo",
        "throughput_speedup_hi",
        "n_batches",
        "spec_tok_s",
        "ar_tok_s",
    ]
    return pd.DataFrame(out, columns=cols)

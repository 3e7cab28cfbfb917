"""Synthetic sweeps with known parameters, in the raw row schema (tests and demos only).

Rows are built like the real decoder's: every round drafts γ tokens and commits
min(accepted + 1, tokens left before max_new_tokens), so the last round of a request is
truncated exactly as in a real run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from specbench.decoding.records import AUTOREGRESSIVE, AUTOREGRESSIVE_STEP, BONUS, RECOVERED, SPECULATIVE


def synthetic_ct_time(k, batch_size=1, context_len=0.0, *, flat=0.020, per_token=0.0015, knee=8, ctx=0.0):
    """Ground-truth C_t for synthetic sweeps: flat up to `knee` tokens (k·batch), then
    rising by `per_token` per token, plus `ctx` seconds per context token."""
    return flat + per_token * np.maximum(0.0, np.asarray(k) * batch_size - knee) + ctx * np.asarray(context_len)


def synthetic_sweep(
    *,
    gammas: Sequence[int] = (1, 2, 3, 4, 5, 6),
    alphas: dict | None = None,
    drafts: dict | None = None,
    batch_sizes: Sequence[int] = (1,),
    n_prompts: int = 12,
    new_tokens: int = 96,
    prompt_tokens: tuple[int, int] = (32, 256),
    repeats: int = 1,
    ct: dict | None = None,
    co: tuple[float, float] = (0.0010, 0.0002),
    co_ar: float = 0.0005,
    cd_ctx: float = 0.0,
    job_context: dict | None = None,
    noise: float = 0.02,
    ct_ks: Sequence[int] = tuple(range(1, 17)),
    ct_contexts: Sequence[int] = (128,),
    ct_per_job: bool = False,
    hardware: str = "cpu:synthetic",
    dtype: str = "bfloat16",
    target: str = "synthetic-target",
    sampling: str = "greedy",
    seed: int = 0,
    context_tokens: Sequence[int] | None = None,
    kv_column_bytes: int = 23040,
    draft_prefill: float = 0.0,
) -> dict[str, pd.DataFrame]:
    """Simulated sweep with known parameters, in the raw row schema (for tests and demos).

    alphas: {workload: per-position α (the last value repeats)}; drafts: {name: (C_d
    intercept, C_d per token)}; ct: keyword arguments of `synthetic_ct_time`; co: C_o =
    co[0] + co[1]·γ; co_ar: overhead of an AR step; cd_ctx: extra draft seconds per
    drafted token per context token; job_context: {γ: extra prompt tokens of that γ's
    jobs}; ct_per_job: each job measures its own C_t(k) rows (with a `job` column, as the
    runner's per-job micro-benchmark does) instead of one shared table.
    context_tokens: run every job once per level, each prompt padded to that many tokens (a context
    sweep; job names gain `_c<level>`). Request rows carry `kv_bytes_target` / `kv_bytes_draft`:
    the batch's padded width (+ γ columns a speculative row may hold past its end) × kv_column_bytes.
    draft_prefill: seconds per prompt token of the draft's prefill, which the speculative decoder pays
    after TTFT and before its first round (in `wall_time`, in no round; `t_draft_prefill`).
    Speculative and AR runs of each prompt batch are interleaved and paired.
    Returns {"rounds", "requests", "ct"} DataFrames.
    """
    rng = np.random.default_rng(seed)
    alphas = alphas or {"chat": (0.85, 0.75, 0.65, 0.6)}
    drafts = drafts or {"tiny": (0.0010, 0.0030)}
    ctp = {"flat": 0.020, "per_token": 0.0015, "knee": 8, "ctx": 0.0, **(ct or {})}
    job_context = job_context or {}
    rcols: dict[str, list] = {
        c: []
        for c in (
            "round",
            "row",
            "gamma",
            "accepted",
            "extra",
            "committed",
            "n_active",
            "context_len",
            "t_draft",
            "t_verify",
            "t_overhead",
            "t_round",
        )
    }
    rkeys: list[dict] = []
    reqs: list[dict] = []

    def jitter(n=None):
        return rng.lognormal(0.0, noise, n) if noise > 0 else (np.ones(n) if n else 1.0)

    for wl, al in alphas.items():
        al = np.asarray(al, float)
        plens = rng.integers(prompt_tokens[0], prompt_tokens[1] + 1, size=n_prompts)
        for dname, (cd_i, cd_s) in drafts.items():
            for b, g, level in [(b, g, c) for b in batch_sizes for g in gammas for c in (context_tokens or [None])]:
                job = f"{wl}_{dname}_b{b}_g{g}" + (f"_c{level}" if level else "")
                base = dict(
                    job=job,
                    target=target,
                    draft=dname,
                    draft_kind="model",
                    workload=wl,
                    category=wl,
                    sampling=sampling,
                    temperature=0.0,
                    top_k=0,
                    top_p=1.0,
                    batch_size=b,
                    dtype=dtype,
                    hardware=hardware,
                )
                pos_alpha = np.array([al[min(i, len(al) - 1)] for i in range(g)])
                for rep in range(repeats):
                    for start in range(0, n_prompts, b):
                        ids = list(range(start, min(start + b, n_prompts)))
                        plen = (np.full(len(ids), level) if level else plens[ids]) + job_context.get(g, 0)
                        for decoder in (AUTOREGRESSIVE, SPECULATIVE):
                            gg = g if decoder == SPECULATIVE else 0
                            keys = {**base, "decoder": decoder, "repeat": rep, "batch": start // b}
                            n = len(ids)
                            gen = np.ones(n, int)  # prefill produced the first token
                            finish = np.zeros(n)
                            nrounds = np.zeros(n, int)
                            ttft = 0.002 + 2e-5 * plen.sum() * (1.3 if gg else 1.0)
                            t_prefill = draft_prefill * float(plen.sum()) if gg else 0.0
                            t, r = t_prefill, 0
                            while True:
                                act = np.nonzero(gen < new_tokens)[0]
                                if len(act) == 0:
                                    break
                                ctx_len = plen[act] + gen[act]
                                L = float(ctx_len.mean())
                                if gg:
                                    acc_mask = rng.random((len(act), gg)) < pos_alpha
                                    accepted = np.cumprod(acc_mask, axis=1).sum(axis=1)
                                    td = (cd_i + gg * (cd_s + cd_ctx * L)) * jitter()
                                    tv = synthetic_ct_time(gg + 1, len(act), L, **ctp) * jitter()
                                    to = (co[0] + co[1] * gg) * jitter()
                                else:
                                    accepted = np.zeros(len(act), int)
                                    td = 0.0
                                    tv = synthetic_ct_time(1, len(act), L, **ctp) * jitter()
                                    to = co_ar * jitter()
                                tr = td + tv + to
                                committed = np.minimum(accepted + 1, new_tokens - gen[act])
                                extra = (
                                    [BONUS if a == gg else RECOVERED for a in accepted]
                                    if gg
                                    else [AUTOREGRESSIVE_STEP] * len(act)
                                )
                                k = len(act)
                                rcols["round"] += [r] * k
                                rcols["row"] += act.tolist()
                                rcols["gamma"] += [gg] * k
                                rcols["accepted"] += accepted.tolist()
                                rcols["extra"] += extra
                                rcols["committed"] += committed.tolist()
                                rcols["n_active"] += [k] * k
                                rcols["context_len"] += ctx_len.tolist()
                                rcols["t_draft"] += [td] * k
                                rcols["t_verify"] += [tv] * k
                                rcols["t_overhead"] += [to] * k
                                rcols["t_round"] += [tr] * k
                                for i in act:
                                    rkeys.append({**keys, "prompt_id": f"{wl}-{ids[i]}"})
                                t += tr
                                gen[act] += committed
                                nrounds[act] += 1
                                finish[act] = t
                                r += 1
                            width = int(plen.max()) + new_tokens - 1 + gg  # rectangular cache at its end
                            for i in range(n):
                                reqs.append(
                                    {
                                        "row": i,
                                        "prompt_tokens": int(plen[i]),
                                        "new_tokens": int(gen[i]),
                                        "kv_bytes_target": width * kv_column_bytes,
                                        "kv_bytes_draft": (width - 1) * kv_column_bytes if gg else 0,
                                        "rounds": int(nrounds[i]),
                                        "wall_time": ttft + finish[i],
                                        "ttft": ttft,
                                        "t_draft_prefill": t_prefill,
                                        "finished_by": "max_new_tokens",
                                        **keys,
                                        "prompt_id": f"{wl}-{ids[i]}",
                                    }
                                )
    rounds = pd.concat([pd.DataFrame(rcols), pd.DataFrame(rkeys)], axis=1)
    requests = pd.DataFrame(reqs)
    ctrows = []
    ct_jobs = (
        sorted({(j, b) for j, b in zip(requests["job"], requests["batch_size"])})
        if ct_per_job
        else [(None, b) for b in batch_sizes]
    )
    for job, b in ct_jobs:
        for k in ct_ks:
            for L in ct_contexts:
                for rep in range(3):
                    ctrows.append(
                        {
                            **({"job": job} if job else {}),
                            "hardware": hardware,
                            "dtype": dtype,
                            "target": target,
                            "batch_size": b,
                            "k": k,
                            "context_len": L,
                            "repeat": rep,
                            "t_forward": float(synthetic_ct_time(k, b, L, **ctp) * jitter()),
                        }
                    )
    return {"rounds": rounds, "requests": requests, "ct": pd.DataFrame(ctrows)}


# The standard noise-free-ish sweep the analysis tests share: position-dependent α, a cheap draft,
# a flat-then-linear C_t(k) and a small C_o.
ALPHAS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.45)
CD = (0.0010, 0.0030)  # C_d intercept, per token (s)
CT = {"flat": 0.020, "per_token": 0.0015, "knee": 8}
CO = (0.0010, 0.0002)
CO_AR = 0.0005


def standard_sweep() -> dict[str, pd.DataFrame]:
    """γ = 1..6, 12 prompts, 96 new tokens, with the constants above."""
    return synthetic_sweep(
        gammas=(1, 2, 3, 4, 5, 6),
        alphas={"chat": ALPHAS},
        drafts={"tiny": CD},
        ct=CT,
        co=CO,
        co_ar=CO_AR,
        n_prompts=12,
        new_tokens=96,
        seed=11,
    )


def many_rounds() -> pd.DataFrame:
    """Round rows with many rounds at each γ, so per-position CIs are tight."""
    return synthetic_sweep(
        gammas=(2, 4, 6), alphas={"chat": ALPHAS}, drafts={"tiny": CD}, n_prompts=24, new_tokens=160, seed=12
    )["rounds"]


def round_rows(pairs, committed=None) -> pd.DataFrame:
    """Round rows from (gamma, accepted) pairs."""
    g, a = zip(*pairs)
    df = pd.DataFrame({"gamma": g, "accepted": a, "decoder": SPECULATIVE})
    df["committed"] = committed if committed is not None else df["accepted"] + 1
    return df

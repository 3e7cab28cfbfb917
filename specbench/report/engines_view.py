"""The engines sections of the report: every engine of a job against every plain engine of the same
job, per prompt (same prompts, seeds and interleaving: `specbench.bench.protocol`), and the timed
engines' per-step costs beside the weight-streaming floors (`specbench.analysis.floor.hardware_limit`),
with the speedup the cost model would give at those floors and the share of it the engine reached.

    ratio = engine tok/s ÷ baseline tok/s per (job, prompt, repeat); median with an exact CI (`median_ci`)
    ideal at the floors = E[N]·F_t / (d·F_d + C_t(d+1))   (d: drafted tokens per round; F: weight bytes ÷ bandwidth)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench.analysis.floor import FLOOR_KEYS
from specbench.analysis.rows import ar_mask, decoder_column, plain_mask, round_level
from specbench.analysis.speedup import break_even_draft_cost, ideal_speedup
from specbench.analysis.stats import median_ci
from specbench.engines import ENGINES, baseline_of, has_timed_rounds
from specbench.report.render import Section

PAIR_ON = ("job", "prompt_id", "repeat")
PER_PROMPT_ROWS = 60  # a longer per-prompt table goes to tables/ only
# hardware_limit's floors and their column suffixes: the library's one-row linear, the best read of a fresh buffer,
# and the best read of each model's own weights where they lie
PROBES = (("matvec", ""), ("read", "_read"), ("own read", "_own"))


def _order(name: str) -> int:
    names = ENGINES.names()
    return names.index(name) if name in names else len(names)


def _requests(requests: pd.DataFrame) -> pd.DataFrame:
    req = requests.assign(decoder=decoder_column(requests))
    return req.assign(tok_s=req["new_tokens"] / req["wall_time"].where(req["wall_time"] > 0))


def engine_pairs(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per (job, prompt, repeat, engine, plain engine of the same job): both tok/s and their ratio."""
    req = _requests(requests)
    on = [c for c in PAIR_ON if c in req.columns]
    if not on or req.empty:
        return pd.DataFrame()
    keep = on + [c for c in ("category", "gamma") if c in req.columns]
    base = req[plain_mask(req)][on + ["decoder", "tok_s"]].rename(
        columns={"decoder": "baseline", "tok_s": "baseline_tok_s"}
    )
    pairs = req[keep + ["decoder", "tok_s"]].merge(base, on=on)
    pairs = pairs[pairs["decoder"] != pairs["baseline"]]
    return pairs.assign(ratio=pairs["tok_s"] / pairs["baseline_tok_s"])


def engines_table(pairs: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Per (job, engine, baseline): prompts, median tok/s of both, the per-prompt ratio's median [CI]."""
    if pairs.empty:
        return pd.DataFrame()
    by = [c for c in ("job",) if c in pairs.columns] + ["decoder", "baseline"]
    rows = []
    for key, g in pairs.groupby(by, sort=False):
        kd = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        m, lo, hi = median_ci(g["ratio"], confidence)
        rows.append(
            {
                **kd,
                "own baseline": baseline_of(kd["decoder"], "") == kd["baseline"],
                "γ": int(g["gamma"].max())
                if "gamma" in g and baseline_of(kd["decoder"], kd["decoder"]) != kd["decoder"]
                else np.nan,
                "n": int(g["ratio"].notna().sum()),
                "engine tok/s": g["tok_s"].median(),
                "baseline tok/s": g["baseline_tok_s"].median(),
                "ratio": m,
                "ratio lo": lo,
                "ratio hi": hi,
            }
        )
    out = pd.DataFrame(rows)
    return out.sort_values(
        by[:-2] + ["decoder", "baseline"], key=lambda s: s.map(_order) if s.name in ("decoder", "baseline") else s
    ).reset_index(drop=True)


def per_prompt_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Per (job, prompt): each engine's tok/s (median over repeats) and its ratio over its own baseline."""
    req = _requests(requests)
    idx = [c for c in ("job", "prompt_id", "category") if c in req.columns]
    if "prompt_id" not in idx:
        return pd.DataFrame()
    wide = req.pivot_table(index=idx, columns="decoder", values="tok_s", aggfunc="median")
    names = sorted(wide.columns, key=_order)
    out = wide[names].rename(columns=lambda n: f"{n} tok/s")
    for name in names:
        base = baseline_of(name, "")
        if base != name and base in wide.columns:
            out[f"{name} ÷ {base}"] = wide[name] / wide[base]
    return out.reset_index()


def _job_costs(rounds: pd.DataFrame, decoder: str) -> dict:
    """E[N], drafted tokens per round, C_d per drafted token, C_t(d+1), C_o (and its share) of one engine's rounds,
    and C_t1 (the forward) and the whole plain step (forward, sampling, commit) of the job's timed baseline rounds
    (means per round, as a cost model reads them)."""
    sp = round_level(rounds[(decoder_column(rounds) == decoder) & (rounds["gamma"] > 0)])
    ar = round_level(rounds[ar_mask(rounds)])
    if sp.empty or ar.empty:
        return {}
    drafted = sp["drafted"].where(sp["drafted"] >= 0, sp["gamma"]) if "drafted" in sp else sp["gamma"]
    rows = sp["rows"].clip(lower=1)
    cd = sp["t_draft"].sum() / drafted.div(rows).sum() if drafted.sum() > 0 else np.nan
    return {
        "γ": int(sp["gamma_setting"].max()) if "gamma_setting" in sp else int(sp["gamma"].max()),
        "E[N]": (sp["committed"] / rows).mean(),
        "drafted per round": (drafted / rows).mean(),
        "C_t1": ar["t_verify"].mean(),
        "plain step": ar["t_round"].mean(),
        "C_d per token": cd,
        "C_t(d+1)": sp["t_verify"].mean(),
        "C_o share": sp["t_overhead"].sum() / sp["t_round"].sum(),
        "C_o": sp["t_overhead"].mean(),
    }


def floor_table(rounds: pd.DataFrame, hardware_limit: pd.DataFrame, engines: pd.DataFrame) -> pd.DataFrame:
    """Per (job, timed speculative engine): its step costs beside the floors (`hardware_limit`'s rows of
    the job's hardware, dtype, target, draft and batch size), c = C_d/C_t1, the ideal speedup at each floor
    and the share of it the engine's measured median speedup over its own baseline reached."""
    if rounds.empty:
        return pd.DataFrame()
    jobs = rounds.groupby("job", sort=False) if "job" in rounds.columns else [(None, rounds)]
    out = []
    for job, r in jobs:
        for decoder in sorted(set(decoder_column(r)), key=_order):
            if not (decoder in ENGINES and ENGINES.get(decoder).speculative and has_timed_rounds(decoder)):
                continue
            costs = _job_costs(r, decoder)
            if not costs:
                continue
            keys = {k: r[k].iloc[0] for k in (*FLOOR_KEYS, "batch_size") if k in r.columns}
            row = {**({"job": job} if job is not None else {}), "decoder": decoder, "draft": keys.get("draft"), **costs}
            row["c = C_d/C_t1"] = costs["C_d per token"] / costs["C_t1"]
            # what the draft may cost for speculation to pay at all, against the whole plain step (the cost model's C_t1)
            tie = row["C_d at break-even"] = break_even_draft_cost(
                costs["E[N]"], costs["plain step"], costs["C_t(d+1)"], costs["C_o"], costs["drafted per round"]
            )
            row["C_d ÷ break-even"] = costs["C_d per token"] / tie if tie > 0 else np.nan  # –: no draft cost pays
            hl = hardware_limit
            if len(hl):
                hl = hl[np.logical_and.reduce([hl[k] == v for k, v in keys.items() if k in hl.columns] or [True])]
            for probe, sfx in PROBES:
                ft = hl[f"target_floor{sfx}"].median() if len(hl) else np.nan
                # n-gram: no weights, a free draft; a draft with weights but no such probe: no floor
                fd = hl[f"draft_floor{sfx}"].where(hl["draft_weight_bytes"] > 0, 0.0).median() if len(hl) else np.nan
                row[f"C_t1 ÷ {probe} floor"] = costs["C_t1"] / ft
                row[f"C_d ÷ {probe} floor"] = costs["C_d per token"] / fd if fd else np.nan
                row[f"ideal at {probe} floors"] = ideal_speedup(
                    costs["E[N]"], ft, costs["drafted per round"] * fd, costs["C_t(d+1)"]
                )
            sel = engines[(engines["decoder"] == decoder) & engines["own baseline"]] if len(engines) else engines
            if job is not None and len(sel) and "job" in sel.columns:
                sel = sel[sel["job"] == job]
            row["measured speedup"] = sel["ratio"].iloc[0] if len(sel) else np.nan
            for probe, _ in PROBES:
                row[f"share of ideal ({probe})"] = row["measured speedup"] / row[f"ideal at {probe} floors"]
            out.append(row)
    return pd.DataFrame(out)


def demonstrated_floor(timing: pd.DataFrame, hardware_limit: pd.DataFrame) -> pd.DataFrame:
    """Per hardware and target: llama.cpp's plain one-token step (its `llama-bench` C_t1, the timing rows whose
    `ct_source` is "llama-bench") beside the weight-streaming floors of specbench's target (`hardware_limit`; the
    F16 GGUF holds the same weights at 2 bytes each): what another engine demonstrates on this box, and specbench's
    C_t1 against it. Empty without llama.cpp rows or floors."""
    if timing.empty or hardware_limit.empty or "ct_source" not in timing.columns:
        return pd.DataFrame()
    out = []
    for _, t in timing[timing["ct_source"] == "llama-bench"].iterrows():
        hl = hardware_limit[(hardware_limit["hardware"] == t["hardware"]) & (hardware_limit["target"] == t["target"])]
        if hl.empty:
            continue
        row = {"hardware": t["hardware"], "target": t["target"], "llama.cpp C_t1": t["ct1"], "C_t1": hl["ct1"].median()}
        for probe, sfx in PROBES:
            row[f"llama.cpp C_t1 ÷ {probe} floor"] = t["ct1"] / hl[f"target_floor{sfx}"].median()
        row["C_t1 ÷ llama.cpp C_t1"] = row["C_t1"] / t["ct1"]
        out.append(row)
    return pd.DataFrame(out)


def _ms(df: pd.DataFrame) -> pd.DataFrame:
    """Seconds -> milliseconds for reading."""
    cols = ("C_t1", "plain step", "C_d per token", "C_t(d+1)", "C_o", "C_d at break-even", "llama.cpp C_t1")
    return df.assign(**{c: df[c] * 1e3 for c in cols if c in df}).rename(columns={c: f"{c} ms" for c in cols})


def engines_tables(
    requests: pd.DataFrame, rounds: pd.DataFrame, hardware_limit: pd.DataFrame, timing: pd.DataFrame
) -> dict:
    """{"engines", "engines_per_prompt", "engines_floors", "engines_llama_floor"}: the tables of `engines_sections`."""
    engines = engines_table(engine_pairs(requests))
    return {
        "engines": engines,
        "engines_per_prompt": per_prompt_table(requests) if len(engines) else pd.DataFrame(),
        "engines_floors": floor_table(rounds, hardware_limit, engines),
        "engines_llama_floor": demonstrated_floor(timing, hardware_limit),
    }


def engines_sections(tables: dict) -> list[Section]:
    """The report sections of `engines_tables` (none when no job ran an engine beside a plain one)."""
    engines, per_prompt, floors = tables["engines"], tables["engines_per_prompt"], tables["engines_floors"]
    if engines.empty:
        return []
    s = Section(
        "Engines head to head",
        text=[
            "Every engine against every plain engine run in the same job: same prompts, seeds and interleaving. "
            "ratio = engine tok/s ÷ baseline tok/s per prompt (wall time, prefill included); median with an exact "
            "95% order-statistic CI (– below 6 prompts). `own baseline`: the plain engine the engine names as its "
            "own (`specbench.engines`); the others set it against another engine's plain decoding."
        ],
    )
    view = engines.assign(ratio=[_ci(m, lo, hi) for m, lo, hi in engines[["ratio", "ratio lo", "ratio hi"]].values])
    s.tables.append(("Each engine against each baseline", view.drop(columns=["ratio lo", "ratio hi"])))
    if len(per_prompt) <= PER_PROMPT_ROWS:
        s.tables.append(("Per prompt: tok/s and the ratio over the engine's own baseline", per_prompt))
    else:
        s.notes.append(f"{len(per_prompt)} per-prompt rows: see tables/engines_per_prompt.csv")
    for i, (title, df) in enumerate(s.tables):  # one job: its name on every row says nothing
        if "job" in df.columns and df["job"].nunique() <= 1:
            s.tables[i] = (title, df.drop(columns="job"))
    sections = [s]
    demonstrated = tables.get("engines_llama_floor", pd.DataFrame())
    if len(floors):
        sections.append(
            Section(
                "Engines at the hardware floor",
                text=[
                    "Per timed speculative engine: E[N], C_t1 (the job's plain forward) and the plain step (forward, "
                    "sampling, commit), C_d per drafted token and "
                    "c = C_d/C_t1, C_t(d+1) of its verification and the C_o share of a round, beside the weight-"
                    "streaming floors (weight bytes ÷ the job's matvec and read bandwidths, and ÷ the read rate of "
                    "each model's own weights where they lie; `Hardware limit`). "
                    "Ideal = E[N]·floor_t / (d·floor_d + C_t(d+1)) with d drafted tokens per round: the speedup "
                    "if both models streamed their weights at the floor; the share is the measured median speedup "
                    "over the engine's own baseline ÷ that ideal. "
                    "C_d at break-even = (E[N]·plain step − C_t(d+1) − C_o) / d: the most a drafted token may cost "
                    "for these rounds to tie the plain steps, at the acceptance, verify cost and overhead measured "
                    "(0, and C_d ÷ break-even –, where even a free draft would not pay). C_d ÷ break-even above 1: "
                    "at this acceptance the draft is too slow for speculation to pay."
                ],
                tables=[
                    (
                        "Costs beside the floors",
                        _ms(floors)
                        .drop(
                            columns=["job"] if floors.get("job", pd.Series()).nunique() <= 1 and "job" in floors else []
                        )
                        .dropna(axis=1, how="all"),  # runs before a probe: no such floor
                    )
                ],
            )
        )
    if len(demonstrated) and len(floors):
        sections[-1].text.append(
            "llama.cpp's plain step (its llama-bench C_t1) beside the same target floors: the floor another engine "
            "demonstrates on this machine, and specbench's C_t1 against it."
        )
        sections[-1].tables.append(("llama.cpp's plain step beside the floors", _ms(demonstrated)))
    return sections


def _ci(m: float, lo: float, hi: float) -> str:
    if not np.isfinite(m):
        return "–"
    return f"{m:.2f}× [{lo:.2f}, {hi:.2f}]" if np.isfinite(lo) else f"{m:.2f}× [–]"

"""Report tables and sections for deployment: serving metrics as engines show them, KV memory per row,
peak memory (when the runner records it) and the γ schedule per batch size with its engine files."""

from __future__ import annotations

import pandas as pd

from specbench.analysis import serving
from specbench.deploy.plan import DEFAULT_METRIC, SPEEDUP_METRICS, plan_schedules
from specbench.deploy.schedule import Schedule, schedule_markdown
from specbench.report import plots
from specbench.report.render import Section

# Keys the serving tables are grouped by (present ones): one row per setting, γ of the job and decoder.
ROUND_KEYS = ("target", "draft", "decoder", "workload", "sampling", "hardware", "dtype", "batch_size", "gamma_setting")
REQUEST_KEYS = (*ROUND_KEYS[:-1], "gamma")
KV_COLUMNS = ("kv_bytes_target", "kv_bytes_draft")
# Peak-memory hook: columns the runner may add to request rows or job meta (any prefix, e.g. "telemetry.").
PEAK_COLUMNS = ("peak_rss_bytes", "peak_cuda_bytes")
SCHEDULE_METRICS = (
    DEFAULT_METRIC,
    *(m for m in SPEEDUP_METRICS.names() if m != DEFAULT_METRIC),
)  # the first drives the engine files
MIB = 2**20


def _present(df: pd.DataFrame, keys) -> list[str]:
    return [k for k in keys if k in df.columns]


def serving_tables(rounds: pd.DataFrame, requests: pd.DataFrame, has_spec: bool) -> dict[str, pd.DataFrame]:
    """The engine-dashboard metrics (`specbench.analysis.serving`), by setting, job γ and decoder."""
    out: dict[str, pd.DataFrame] = {}
    if has_spec:
        by = _present(rounds, ROUND_KEYS)
        out["mean_acceptance_length"] = serving.mean_acceptance_length(rounds, by)
        out["acceptance_length_histogram"] = serving.acceptance_length_histogram(rounds, by)
        out["acceptance_by_position_both"] = serving.acceptance_by_position(rounds, by)
        if any(c in rounds.columns for c in serving.REQUEST_ID_COLUMNS):
            out["request_acceptance"] = serving.request_acceptance_summary(rounds, by)
    if {"wall_time", "ttft", "new_tokens"} <= set(requests.columns):
        out["latency_percentiles"] = serving.latency_percentiles(requests, _present(requests, REQUEST_KEYS))
    return out


def kv_table(requests: pd.DataFrame) -> pd.DataFrame:
    """KV bytes held per row at the end of its request, by decoder, batch size and γ: median and max (MiB)."""
    if not set(KV_COLUMNS) <= set(requests.columns):
        return pd.DataFrame()
    keys = _present(requests, ("target", "draft", "decoder", "dtype", "batch_size", "gamma"))
    agg = (
        requests.groupby(keys, dropna=False, sort=True)
        .agg(
            requests=("kv_bytes_target", "size"),
            target_median=("kv_bytes_target", "median"),
            target_max=("kv_bytes_target", "max"),
            draft_median=("kv_bytes_draft", "median"),
            draft_max=("kv_bytes_draft", "max"),
        )
        .reset_index()
    )
    for c in ("target_median", "target_max", "draft_median", "draft_max"):
        agg[c] = agg[c] / MIB
    stats = [c for c in agg.columns if c.endswith(("median", "max"))]  # target_max -> "target KV MiB (max)"
    return agg.rename(columns={c: f"{c.replace('_', ' KV MiB (')})" for c in stats})


def peak_memory_table(requests: pd.DataFrame, meta: pd.DataFrame | None) -> pd.DataFrame:
    """Peak memory per job from request rows or job meta columns ending in PEAK_COLUMNS (max per job)."""
    frames = []
    for df in (requests, meta):
        if df is None or "job" not in df.columns:
            continue
        cols = [c for c in df.columns if c.endswith(PEAK_COLUMNS)]
        if cols:
            frames.append(df.groupby("job")[cols].max().rename(columns=lambda c: c.rsplit(".", 1)[-1]))
    if not frames:
        return pd.DataFrame()
    peak = pd.concat(frames, axis=1)
    peak = peak.T.groupby(level=0).max().T  # the same column from rows and meta: keep the larger
    return (peak / MIB).add_suffix(" (MiB)").reset_index()


def compute_schedules(requests: pd.DataFrame) -> tuple[dict[str, list[Schedule]], str | None]:
    """Schedules per metric when the sweep has >= 2 batch sizes ({} and a note otherwise)."""
    if "batch_size" not in requests.columns or requests["batch_size"].nunique() < 2:
        return {}, "γ schedule per batch size: skipped (fewer than two batch sizes in this sweep)"
    out, notes = {}, []
    for metric in SCHEDULE_METRICS:
        try:
            out[metric] = plan_schedules(requests, metric)
        except ValueError as e:
            notes.append(f"γ schedule ({metric}): {e}")
    return out, "; ".join(notes) or None


def serving_section(tables: dict[str, pd.DataFrame], drop, fig) -> Section:
    """Serving metrics as vLLM / SGLang report them; `drop` hides constant keys, `fig(sec, res, name, cap)`."""
    s = Section(
        "Serving metrics (engine definitions)",
        text=[
            "Mean acceptance length (vLLM's definition) = 1 + Σaccepted / Σdrafting rounds (plain decoding scores 1); "
            "draft acceptance rate = Σaccepted / Σγ. Per position i, two rates that differ: the conditional α_i "
            "(specbench) = P(accepted ≥ i | accepted ≥ i−1), which the cost model multiplies, and the unconditional, "
            "vLLM-style rate = #rounds with accepted ≥ i / #rounds that drafted i (= Π_{j≤i} α_j). Latency: TTFT; "
            "TPOT = (wall − TTFT) / (new tokens − first chunk); e2e = wall; numpy percentiles, linear interpolation."
        ],
    )
    if "mean_acceptance_length" in tables:
        s.tables.append(("Mean acceptance length (vLLM definition)", drop(tables["mean_acceptance_length"])))
        fig(
            s,
            plots.plot_acceptance_histogram(tables["acceptance_length_histogram"]),
            "acceptance_length_histogram.png",
            "Acceptance length (accepted + 1) per round: fraction of rounds.",
        )
        h = tables["acceptance_length_histogram"]
        keys = [c for c in h.columns if c not in ("acceptance_length", "count", "fraction")]
        wide = h.pivot_table(index=keys, columns="acceptance_length", values="fraction", dropna=False).reset_index()
        wide.columns = [f"len {c}" if isinstance(c, (int,)) or str(c).isdigit() else c for c in wide.columns]
        s.tables.append(("Acceptance-length histogram (fraction of rounds)", drop(wide)))
        pos = tables["acceptance_by_position_both"].rename(
            columns={
                "conditional_acceptance": "conditional α_i (specbench)",
                "unconditional_acceptance": "unconditional, vLLM-style",
            }
        )
        s.tables.append(("Per-position acceptance, both forms", drop(pos)))
    if "request_acceptance" in tables:
        s.tables.append(
            ("Per-request acceptance (Σaccepted / Σγ per request) across requests", drop(tables["request_acceptance"]))
        )
    if "latency_percentiles" in tables:
        lat = tables["latency_percentiles"].copy()
        for c in ("mean", "p50", "p95", "p99"):
            lat[c] = lat[c] * 1e3
        s.tables.append(
            (
                "Latency percentiles per decoder (ms)",
                drop(lat.rename(columns={"mean": "mean ms", "p50": "P50 ms", "p95": "P95 ms", "p99": "P99 ms"})),
            )
        )
    else:
        s.notes.append("latency percentiles: request rows lack wall_time / ttft / new_tokens")
    return s


def memory_section(kv: pd.DataFrame, peak: pd.DataFrame, drop) -> Section:
    """KV bytes per row by γ and batch size, and peak memory per job when recorded."""
    s = Section(
        "Memory",
        text=[
            "KV cache held by one row when its request finished: allocated cache columns (left padding and "
            "rolled-back holes of the rectangular cache included) × bytes per column, read off the cache tensors "
            "(2 × layers × KV heads × head dim × element size). 0 for model-free drafts and the baseline's draft; "
            "empty (–) where the decoder cannot see the cache (hf_assisted's draft)."
        ],
    )
    if len(kv):
        s.tables.append(("KV cache per row (MiB)", drop(kv)))
    else:
        s.notes.append("KV bytes: request rows have no kv_bytes_target / kv_bytes_draft columns (older runs)")
    if len(peak):
        s.tables.append(("Peak memory per job (MiB)", peak))
    else:
        s.notes.append("peak memory: not recorded by this sweep (no peak_rss_bytes / peak_cuda_bytes)")
    return s


def schedule_section(schedules: dict[str, list[Schedule]], note: str | None, links: list[str]) -> Section:
    """The γ schedule per batch size for each metric, and links to the engine files written from the first."""
    s = Section(
        "γ schedule per batch size",
        text=[
            "Per setting and batch size: the γ with the best measured speedup, or off (plain decoding) when its 95% "
            f"CI includes 1 (`specbench.deploy.schedule`). Engine files follow the {SCHEDULE_METRICS[0]} schedule "
            "(also: `python -m specbench.deploy runs/<sweep> --metric ...`)."
        ],
    )
    for metric, sched in schedules.items():
        s.pre.append(f"{metric} speedup\n\n" + schedule_markdown(sched).strip())
    s.links += [(p, p) for p in links]
    if note:
        s.notes.append(note)
    return s

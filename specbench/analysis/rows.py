"""Row selection and grouping shared by every analysis module (raw schema of
`specbench.decoding.records`, plus the `job` key that `runstore.load_sweep` adds).

Conventions
-----------
* **Rows.** "Speculative rows" are round rows of any engine but the plain ones
  (`specbench.engines.is_baseline`) with ``gamma > 0``; "AR rows" are the timed rounds of a plain
  engine (specbench's autoregressive decoding).
* **γ of a row vs γ of a job.** Acceptance and E[N] are keyed by the *row's* ``gamma``
  (tokens actually drafted that round). Speedups are per *job*; a job's γ setting
  (``gamma_setting`` on round rows, ``gamma`` on request rows, see :func:`add_gamma_setting`)
  is the largest γ its speculative rows drafted. The AR rows of a job carry the same setting.
* **Timings are per round.** The times of a round are shared by all its batch rows, so
  timing fits use one observation per round (:func:`round_level`) and, where at least 3
  exist, only full-batch rounds (:func:`full_batch`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pandas as pd

from specbench.decoding.records import AUTOREGRESSIVE, SPECULATIVE
from specbench.engines import baseline_of, has_timed_rounds, is_baseline

# Keys that identify what an acceptance profile depends on (not hardware or batch).
ACCEPTANCE_KEYS = ("target", "draft", "decoder", "workload", "sampling")
# Keys a timing profile is specific to.
TIMING_KEYS = ("hardware", "dtype", "forward", "target", "draft", "decoder", "batch_size")
# Keys of one "setting" for speedup comparisons (one acceptance x one timing profile).
SETTING_KEYS = ("target", "draft", "decoder", "workload", "sampling", "hardware", "dtype", "forward", "batch_size")
# Keys that do not select the AR baseline rows of a setting.
AR_IGNORE = ("draft", "draft_kind", "decoder", "gamma", "gamma_setting")

_ROUND_ID = ("job", "decoder", "repeat", "batch", "round", "gamma", "t_draft", "t_verify", "t_overhead", "t_round")


def group_keys(df: pd.DataFrame, by: Iterable[str] | str | None, default: Sequence[str] = ()) -> list[str]:
    """Grouping keys: `by` as a list (each must be a column), or the `default` keys present in df."""
    if by is None:
        return [k for k in default if k in df.columns]
    keys = [by] if isinstance(by, str) else list(by)
    missing = [k for k in keys if k not in df.columns]
    if missing:
        raise ValueError(f"grouping keys {missing} are not columns; available: {sorted(df.columns)}")
    return keys


def iter_groups(df: pd.DataFrame, by: list[str]) -> Iterator[tuple[dict, pd.DataFrame]]:
    """(key dict, sub-frame) per group of `by` (sorted, NaN keys kept); one group {} if `by` is empty."""
    if not by:
        yield {}, df
        return
    for key, sub in df.groupby(by, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        yield dict(zip(by, key)), sub


def match_rows(df: pd.DataFrame, keys: dict, ignore: Iterable[str] = ()) -> pd.Series:
    """Mask of the rows of df whose columns equal `keys` (NaN matches NaN); keys not in df are ignored."""
    mask = pd.Series(True, index=df.index)
    for k, v in keys.items():
        if k in ignore or k not in df.columns:
            continue
        if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
            mask &= df[k].isna()
        else:
            mask &= df[k] == v
    return mask


def native(v):
    """numpy scalar -> Python scalar, NaN/NA -> None (for JSON)."""
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        v = float(v)
    if isinstance(v, float) and math.isnan(v):
        return None
    if v is pd.NA:
        return None
    return v


def decoder_column(df: pd.DataFrame) -> pd.Series:
    """The `decoder` column, or one inferred from `gamma` (> 0: speculative) when absent."""
    if "decoder" in df.columns:
        return df["decoder"].astype(object)
    return pd.Series(np.where(df["gamma"] > 0, SPECULATIVE, AUTOREGRESSIVE), index=df.index, dtype=object)


def baseline_column(df: pd.DataFrame) -> pd.Series:
    """Per row, the plain engine it is paired with (`Engine.baseline`; a plain engine's own name),
    specbench's autoregressive for names no engine registers."""
    dec = decoder_column(df)
    return dec.map(lambda name: baseline_of(name, AUTOREGRESSIVE)).astype(object)


def plain_mask(df: pd.DataFrame) -> pd.Series:
    """Rows of plain engines (each its own baseline: `specbench.engines.is_baseline`)."""
    return decoder_column(df).map(is_baseline).astype(bool)


def decode_phase(requests: pd.DataFrame, prefix: str = "") -> tuple[pd.Series, pd.Series]:
    """(seconds, tokens) of each request's decode phase: after its first chunk of tokens (TTFT).

    The first chunk is one token for specbench's decoders and may be several for transformers'
    assisted generation (`first_chunk_tokens`; rows written before that column existed mean 1).
    Tokens are NaN where the decode phase is empty, so no rate over-counts.
    """
    new = requests[f"{prefix}new_tokens"]
    first = requests[f"{prefix}first_chunk_tokens"] if f"{prefix}first_chunk_tokens" in requests else 1
    tokens = (new - first).where(new > first)
    return requests[f"{prefix}wall_time"] - requests[f"{prefix}ttft"], tokens


def spec_rows(rounds: pd.DataFrame) -> pd.DataFrame:
    """Round rows of speculative engines (any but the plain ones) with gamma > 0."""
    return rounds[~plain_mask(rounds) & (rounds["gamma"] > 0)]


def ar_mask(df: pd.DataFrame) -> pd.Series:
    """Rows of the plain engine whose rounds are timed: specbench's autoregressive baseline, the cost
    model's and the tuner's reference (not transformers' or llama.cpp's plain decoding)."""
    return plain_mask(df) & decoder_column(df).map(has_timed_rounds).astype(bool)


def ar_rows(rounds: pd.DataFrame) -> pd.DataFrame:
    """Round rows of specbench's autoregressive baseline (`ar_mask`)."""
    return rounds[ar_mask(rounds)]


def add_gamma_setting(rounds: pd.DataFrame, requests: pd.DataFrame | None = None):
    """Add each job's γ setting: `gamma_setting` on round rows, `gamma` on request rows.

    A job's setting is its `gamma_setting` column where present (the runner's job key;
    `gamma_config` in runs written before the rename), else the largest `gamma` among its speculative rows (a decoder may draft fewer near
    max_new_tokens). The AR rows and requests of the job get the same value. Without
    either, a `gamma` column already on requests is kept. Returns (rounds, requests)
    copies (requests is None if not given).
    """
    rounds = rounds.copy()
    if "gamma_config" in rounds.columns and "gamma_setting" not in rounds.columns:
        rounds["gamma_setting"] = rounds["gamma_config"]
    if requests is not None:
        key = next((c for c in ("gamma_setting", "gamma_config") if c in requests.columns), None)
        if key:  # the AR requests of a job belong to its γ setting too
            requests = requests.copy()
            requests["gamma"] = requests[key]
    sp = spec_rows(rounds)
    if "job" in rounds.columns:
        by_job = sp.groupby("job")["gamma"].max()
        if "gamma_setting" not in rounds.columns:
            rounds["gamma_setting"] = rounds["job"].map(by_job)
    else:
        by_job = None
        if "gamma_setting" not in rounds.columns:
            rounds["gamma_setting"] = sp["gamma"].max() if len(sp) else np.nan
    if requests is not None:
        requests = requests.copy()
        if "gamma" not in requests.columns:
            if by_job is not None and "job" in requests.columns:
                requests["gamma"] = requests["job"].map(by_job)
            else:
                requests["gamma"] = sp["gamma"].max() if len(sp) else np.nan
    return rounds, requests


def round_level(rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per decoding round: times are shared by all batch rows of a round.

    A round is identified by (job, decoder, repeat, batch, round, gamma) and its times;
    `context_len` becomes the mean over its rows, `n_active` the max, `accepted` and
    `committed` the sums, `rows` the number of batch rows.
    """
    keys = [c for c in _ROUND_ID if c in rounds.columns]
    extra = [
        c for c in (*TIMING_KEYS, "workload", "sampling", "gamma_setting") if c in rounds.columns and c not in keys
    ]
    if rounds.empty:
        return rounds.assign(rows=pd.Series(dtype=int))
    rid = rounds.groupby(keys, dropna=False, sort=False).ngroup().to_numpy()  # ids in order of appearance
    first = ~pd.Series(rid).duplicated().to_numpy()
    out = rounds.loc[first, keys + extra].reset_index(drop=True)
    n = len(out)
    rows = np.bincount(rid, minlength=n)
    out["context_len"] = np.bincount(rid, rounds["context_len"].to_numpy(float), n) / rows
    n_active = np.zeros(n, int)
    np.maximum.at(n_active, rid, rounds["n_active"].to_numpy(int))
    out["n_active"] = n_active
    out["accepted"] = np.bincount(rid, rounds["accepted"].to_numpy(float), n).astype(int)
    out["committed"] = np.bincount(rid, rounds["committed"].to_numpy(float), n).astype(int)
    out["rows"] = rows
    return out


def full_batch(rl: pd.DataFrame, min_rounds: int = 3) -> pd.DataFrame:
    """Full-batch rounds (n_active == batch_size) of a `round_level` frame if at least `min_rounds` exist, else all."""
    if "batch_size" in rl.columns and len(rl):
        m = rl["n_active"] >= rl["batch_size"]
        if m.sum() >= min_rounds:
            return rl[m]
    return rl


def setting_keys(rounds: pd.DataFrame, by) -> list[str]:
    """`by` (default SETTING_KEYS present) plus any timing key that varies (a timing
    profile must be for one timing setting); never the γ keys."""
    sp = spec_rows(rounds)
    keys = [k for k in group_keys(sp, by, SETTING_KEYS) if k not in ("gamma", "gamma_setting")]
    for k in TIMING_KEYS:
        if k in sp.columns and k not in keys and sp[k].nunique(dropna=False) > 1:
            keys.append(k)
    return keys


def setting_rows(rounds: pd.DataFrame, kd: dict) -> pd.DataFrame:
    """Speculative rows of a setting plus the AR rows that share its timing keys."""
    sp = spec_rows(rounds)
    ar = ar_rows(rounds)
    return pd.concat([sp[match_rows(sp, kd)], ar[match_rows(ar, kd, ignore=AR_IGNORE)]])

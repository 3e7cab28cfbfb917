"""A γ schedule per batch size, with speculation OFF as a choice, from measured speedups with CIs.

Rule (per setting and batch size, `analysis.speedup.best_to_deploy`): among the γ whose whole CI
lies above 1 (`analysis.speedup.speedup_verdict` 'faster'), take the best point estimate; when no γ
is measurably faster — every CI includes 1, or lies below it, or is missing — the choice is "off"
(γ = 0, plain decoding, speedup 1 by definition), and the best point estimate is shown as the
evidence. Ties with 1 go to off; ties between γ go to the smaller γ (less draft work, same gain).
Consecutive batch sizes with the same choice merge into ranges.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from specbench.analysis.speedup import best_to_deploy, speedup_verdict

OFF = 0  # γ of "no speculation"
# Setting columns a schedule is kept apart by (present ones are used).
SCHEDULE_KEYS = ("pair", "target", "draft", "draft_kind", "workload", "sampling", "hardware", "dtype", "decoder")


def speedup_columns(metric: str) -> tuple[str, str, str]:
    """(point, lo, hi) column names of a metric prefix: 'latency' -> latency_speedup[_lo, _hi]."""
    base = f"{metric}_speedup"
    return base, f"{base}_lo", f"{base}_hi"


@dataclass(frozen=True)
class Choice:
    """What to run at one measured batch size: `gamma` (0 = off) and the evidence for it."""

    batch_size: int
    gamma: int  # 0: speculation off
    speedup: float  # of the chosen γ; 1.0 when off
    lo: float
    hi: float
    best_gamma: int  # the chosen γ, or when off the γ with the best point estimate (0 if none measured)
    best_speedup: float
    best_lo: float
    best_hi: float
    reason: str

    @property
    def off(self) -> bool:
        return self.gamma == OFF


@dataclass(frozen=True)
class Range:
    """Consecutive measured batch sizes [lo, hi] sharing one choice of γ (0 = off)."""

    lo: int
    hi: int
    gamma: int

    def label(self) -> str:
        return f"{self.lo}" if self.lo == self.hi else f"{self.lo}-{self.hi}"


@dataclass
class Schedule:
    """γ per measured batch size for one setting, and where speculation stops paying."""

    setting: dict
    metric: str
    choices: list[Choice] = field(default_factory=list)

    @property
    def ranges(self) -> list[Range]:
        out: list[Range] = []
        for c in self.choices:
            if out and out[-1].gamma == c.gamma:
                out[-1] = Range(out[-1].lo, c.batch_size, c.gamma)
            else:
                out.append(Range(c.batch_size, c.batch_size, c.gamma))
        return out

    @property
    def off_from(self) -> int | None:
        """Smallest measured batch size from which speculation is off at every larger one (None: on at the largest)."""
        if not self.choices or not self.choices[-1].off:
            return None
        return self.ranges[-1].lo

    def verdict(self) -> str:
        """One sentence: the batch size past which speculation stops paying."""
        if not self.choices:
            return "no measurements"
        sizes = [c.batch_size for c in self.choices]
        if all(c.off for c in self.choices):
            return f"speculation does not pay at any measured batch size ({sizes[0]}-{sizes[-1]})"
        if self.off_from is None:
            return f"speculation pays up to the largest measured batch size ({sizes[-1]})"
        last_on = sizes[sizes.index(self.off_from) - 1]
        return f"speculation stops paying past batch size {last_on} (off from {self.off_from})"

    def gamma_for(self, batch_size: int) -> int:
        """γ at a batch size: the choice of the largest measured batch size ≤ it (the smallest if below all)."""
        below = [c for c in self.choices if c.batch_size <= batch_size]
        return (below[-1] if below else self.choices[0]).gamma

    def to_frame(self) -> pd.DataFrame:
        rows = [{**self.setting, "metric": self.metric, **asdict(c)} for c in self.choices]
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        """JSON-ready: NaN (no CI) becomes null."""
        choices = [
            {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(c).items()}
            for c in self.choices
        ]
        return {
            "setting": self.setting,
            "metric": self.metric,
            "verdict": self.verdict(),
            "ranges": [asdict(r) for r in self.ranges],
            "choices": choices,
        }


def choose_gamma(rows: pd.DataFrame, metric: str, batch_size: int) -> Choice:
    """The choice at one batch size from its rows (one per γ): the best measurably faster γ, else off."""
    col, col_lo, col_hi = speedup_columns(metric)
    cand = rows[rows["gamma"] > OFF]
    cand = cand[np.isfinite(pd.to_numeric(cand[col], errors="coerce").to_numpy(float))]
    if cand.empty:
        return Choice(batch_size, OFF, 1.0, 1.0, 1.0, OFF, math.nan, math.nan, math.nan, "no speculative measurement")
    best = cand.loc[best_to_deploy(cand, col)]
    g, s, lo, hi = int(best["gamma"]), float(best[col]), float(best[col_lo]), float(best[col_hi])
    evidence = (g, s, lo, hi)
    if speedup_verdict(lo, hi) == "faster":
        return Choice(batch_size, g, s, lo, hi, *evidence, f"γ={g}: {s:.2f}× [{lo:.2f}, {hi:.2f}]")
    if s <= 1.0:
        reason = f"best γ={g} is not faster ({s:.2f}×)"
    elif not math.isfinite(lo):
        reason = f"best γ={g} ({s:.2f}×) has no CI (too few prompts)"
    else:
        reason = f"best γ={g} ({s:.2f}× [{lo:.2f}, {hi:.2f}]): CI includes 1"
    return Choice(batch_size, OFF, 1.0, 1.0, 1.0, *evidence, reason)


def _check_table(table: pd.DataFrame, metric: str) -> None:
    needed = ["batch_size", "gamma", *speedup_columns(metric)]
    missing = [c for c in needed if c not in table.columns]
    if missing:
        prefixes = sorted({c.removesuffix("_speedup") for c in table.columns if c.endswith("_speedup")})
        raise ValueError(
            f"metric={metric!r}: the speedup table lacks columns {missing}; "
            f"metrics it has: {prefixes or 'none'} (columns: {sorted(table.columns)})"
        )
    for col, low in (("batch_size", 1), ("gamma", OFF)):
        bad = table[(table[col] < low) | (table[col] % 1 != 0)]
        if len(bad):
            raise ValueError(f"{col}={_plain(bad[col].iloc[0])!r}: must be an integer >= {low}")


def build_schedules(table: pd.DataFrame, metric: str = "latency", by: Iterable[str] | None = None) -> list[Schedule]:
    """One Schedule per setting of a speedup table (rows: setting keys, batch_size, gamma, <metric>_speedup[_lo,_hi]).

    `by` names the setting columns (default: the SCHEDULE_KEYS present). γ = 0 rows (plain decoding)
    may be present and are ignored: off needs no measurement.
    """
    _check_table(table, metric)
    keys = [k for k in SCHEDULE_KEYS if k in table.columns] if by is None else list(by)
    groups = table.groupby(keys, dropna=False, sort=True) if keys else [((), table)]
    out = []
    for key, sub in groups:
        setting = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        choices = [choose_gamma(rows, metric, int(bs)) for bs, rows in sub.groupby("batch_size", sort=True)]
        out.append(Schedule({k: _plain(v) for k, v in setting.items()}, metric, choices))
    return out


def _plain(v):
    """numpy scalars -> Python scalars (JSON, YAML and f-strings stay tidy)."""
    return v.item() if hasattr(v, "item") else v


def schedule_markdown(schedules: list[Schedule]) -> str:
    """The schedules as markdown: per setting, a ranges line, the verdict, and the per-batch-size table."""
    lines = []
    for s in schedules:
        title = ", ".join(f"{k}={v}" for k, v in s.setting.items()) or "all rows"
        lines += [
            f"## {title}",
            "",
            f"Metric: {s.metric} speedup. {s.verdict().capitalize()}.",
            "",
            "Schedule: "
            + "; ".join(f"B {r.label()}: " + ("off" if r.gamma == OFF else f"γ={r.gamma}") for r in s.ranges),
            "",
            "| batch size | choice | speedup [95% CI] | best measured γ | why |",
            "| --- | --- | --- | --- | --- |",
        ]
        for c in s.choices:
            ci = f"[{c.best_lo:.2f}, {c.best_hi:.2f}]" if math.isfinite(c.best_lo) else "[no CI]"
            best = "—" if c.best_gamma == OFF else f"γ={c.best_gamma}: {c.best_speedup:.2f}× {ci}"
            chosen = "off" if c.off else f"γ={c.gamma}"
            shown = "1.00× (plain decoding)" if c.off else f"{c.speedup:.2f}× [{c.lo:.2f}, {c.hi:.2f}]"
            lines.append(f"| {c.batch_size} | {chosen} | {shown} | {best} | {c.reason} |")
        lines.append("")
    return "\n".join(lines)

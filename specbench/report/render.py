"""Rendering of report sections: markdown and a self-contained HTML page (plots as data URIs)."""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd


@dataclass
class Section:
    """One report section: paragraphs, preformatted blocks, figures (PNG name, caption), tables, notes."""

    title: str
    text: list[str] = field(default_factory=list)
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    pre: list[str] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)  # (relative path, label): files beside the report


def fmt_value(v) -> str:
    """A table cell: '–' for missing, yes/no, integers plain, floats to 3 significant-ish digits."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return "–"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if math.isinf(v):  # int(v) would raise: a ratio over a zero cost
            return "∞" if v > 0 else "−∞"
        if v == int(v) and abs(v) < 1e6:
            return str(int(v))
        if abs(v) >= 100:
            return f"{v:.1f}"
        if abs(v) >= 0.01:
            return f"{v:.3f}"
        return f"{v:.3g}"
    return str(v)


def _strings(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({c: [fmt_value(v) for v in df[c]] for c in df.columns}, index=range(len(df)))


def md_table(df: pd.DataFrame) -> str:
    """A GitHub markdown table ('_(no rows)_' if empty)."""
    if df.empty:
        return "_(no rows)_\n"
    s = _strings(df)
    esc = lambda x: str(x).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(c) for c in s.columns) + " |", "|" + "---|" * len(s.columns)]
    lines += ["| " + " | ".join(esc(v) for v in row) + " |" for row in s.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def html_table(df: pd.DataFrame) -> str:
    """An escaped HTML table."""
    if df.empty:
        return "<p><em>(no rows)</em></p>"
    return _strings(df).to_html(index=False, escape=True, border=0, classes="t")


def render_md(title: str, meta: dict, sections: list[Section]) -> str:
    """The report as markdown (figures as relative links to the PNGs beside it)."""
    out = [f"# {title}", "", " · ".join(f"**{k}**: {v}" for k, v in meta.items()), ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        out += [p + "\n" for p in s.text]
        for block in s.pre:
            out += ["```", block, "```", ""]
        for name, cap in s.figures:
            out += [f"![{cap}]({name})", ""]
        for cap, df in s.tables:
            if cap:
                out += [f"**{cap}**", ""]
            out += [md_table(df)]
        if s.links:
            out += [f"- [{lab}]({path})" for path, lab in s.links] + [""]
        for n in s.notes:
            out += [f"> note: {n}", ""]
    return "\n".join(out)


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1300px;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:1.6em}
table.t{border-collapse:collapse;font-size:0.85em;margin:8px 0 16px}
table.t th,table.t td{border:1px solid #ddd;padding:3px 7px;text-align:right}
table.t th{background:#f3f3f3}
pre{background:#f7f7f7;padding:10px;overflow-x:auto;font-size:0.85em}
img{max-width:100%;border:1px solid #eee;margin:6px 0}
.note{color:#8a5a00;font-style:italic}.meta{color:#555;font-size:0.9em}
figcaption{color:#555;font-size:0.85em}
"""


def render_html(title: str, meta: dict, sections: list[Section], out_dir: Path) -> str:
    """The report as one self-contained HTML page: the PNGs in out_dir are embedded as data URIs."""
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        f"<title>{e(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        "<p class='meta'>" + " · ".join(f"<b>{e(k)}</b>: {e(str(v))}" for k, v in meta.items()) + "</p>",
    ]
    for s in sections:
        out.append(f"<h2>{e(s.title)}</h2>")
        out += [f"<p>{e(p)}</p>" for p in s.text]
        out += [f"<pre>{e(b)}</pre>" for b in s.pre]
        for name, cap in s.figures:
            data = base64.b64encode((out_dir / name).read_bytes()).decode("ascii")
            out.append(
                f"<figure><img alt='{e(cap)}' src='data:image/png;base64,{data}'>"
                f"<figcaption>{e(cap)}</figcaption></figure>"
            )
        for cap, df in s.tables:
            if cap:
                out.append(f"<h3>{e(cap)}</h3>")
            out.append(html_table(df))
        if s.links:
            items = "".join(f"<li><a href='{e(path)}'>{e(lab)}</a></li>" for path, lab in s.links)
            out.append(f"<ul>{items}</ul>")
        out += [f"<p class='note'>note: {e(n)}</p>" for n in s.notes]
    out.append("</body></html>")
    return "\n".join(out)

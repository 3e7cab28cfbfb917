"""AuditResult: the verdict table, the per-test table, and their markdown / CSV forms."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from specbench.audit.settings import AuditSettings

SUMMARY_COLUMNS = [
    "decoder",
    "sampling",
    "gamma",
    "reference",
    "prompts",
    "tokens",
    "samples",
    "reference_samples",
    "tests",
    "p_value",
    "worst_test",
    "tv",
    "tv_lo",
    "tv_hi",
    "tv_null",
    "detectable_tv",
    "verdict",
    "seconds",
]


@dataclass
class AuditResult:
    """One or more audits: `summary` (the verdicts) and `tests` (every test), with their settings."""

    summary: pd.DataFrame  # one row per audit (decoder x sampling config): the verdict table
    tests: pd.DataFrame  # one row per individual test, with raw and Holm-adjusted p-values
    settings: AuditSettings
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool((self.summary["verdict"] == "pass").all())

    @staticmethod
    def concat(results: list[AuditResult]) -> AuditResult:
        notes = [n for r in results for n in r.notes]
        return AuditResult(
            pd.concat([r.summary for r in results], ignore_index=True),
            pd.concat([r.tests for r in results], ignore_index=True),
            results[0].settings,
            list(dict.fromkeys(notes)),
        )

    def to_markdown(self) -> str:
        s = self.settings
        table = self.summary.copy()
        table["p_value"] = table["p_value"].map(lambda p: f"{p:.2g}")
        table["tv (95% CI)"] = [
            f"{t:.3f} [{lo:.3f}, {hi:.3f}]" for t, lo, hi in zip(table["tv"], table["tv_lo"], table["tv_hi"])
        ]
        for col in ("tv_null", "detectable_tv"):
            table[col] = table[col].map(lambda v: f"{v:.3f}")
        table["verdict"] = table["verdict"].map(lambda v: "pass" if v == "pass" else "**FAIL**")
        cols = [
            "decoder",
            "sampling",
            "gamma",
            "reference",
            "samples",
            "tests",
            "p_value",
            "tv (95% CI)",
            "tv_null",
            "detectable_tv",
            "verdict",
        ]
        lines = [
            "# Lossless audit",
            "",
            f"Overall: **{'PASS' if self.passed else 'FAIL'}** "
            f"(family-wise alpha = {s.alpha}, Holm over every test of an audit; {s.tokens} tokens per continuation; "
            f"detectable TV at power {s.power}).",
            "",
            _markdown_table(table[cols]),
            "",
            "- `samples`: continuations per prompt from the decoder; `reference`: `exact` = enumerated target "
            "distribution (chi-square goodness of fit), `sample (n)` = plain target sampling, n per prompt (G-test).",
            "- `p_value`: smallest Holm-adjusted p-value of the audit; `tv`: total variation between the decoder's "
            "and the target's joint distribution of the first tokens (pooled bins), bootstrap bias-corrected, with a "
            "basic bootstrap 95% interval, for the prompt with the largest one; `tv_null`: the plug-in TV expected "
            "when the distributions are equal (noise floor).",
            "- `detectable_tv`: smallest joint TV the joint test detects with power "
            f"{s.power} at level alpha/m, whatever the deviation's shape (noncentral chi-square, chi2 >= 4 TV^2).",
        ]
        lines += [f"- note: {n}" for n in self.notes]
        worst = self.tests.sort_values("p_adjusted").groupby(["decoder", "sampling"], sort=False).head(3).copy()
        for col in ("p_value", "p_adjusted"):
            worst[col] = worst[col].map(lambda p: f"{p:.2g}")
        for col in ("tv", "tv_null", "detectable_tv"):
            worst[col] = worst[col].map(lambda v: f"{v:.3f}")
        lines += [
            "",
            "## Most significant tests of each audit",
            "",
            _markdown_table(
                worst[
                    [
                        "decoder",
                        "sampling",
                        "prompt",
                        "test",
                        "kind",
                        "n",
                        "bins",
                        "p_value",
                        "p_adjusted",
                        "tv",
                        "tv_null",
                        "detectable_tv",
                    ]
                ]
            ),
        ]
        return "\n".join(lines) + "\n"

    def save(self, out: str | Path) -> Path:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.summary.to_csv(out / "audit.csv", index=False)
        self.tests.to_csv(out / "audit_tests.csv", index=False)
        (out / "audit.md").write_text(self.to_markdown(), encoding="utf-8")
        return out


def _markdown_table(df: pd.DataFrame) -> str:
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    sep = "| " + " | ".join("---" for _ in df.columns) + " |"
    rows = ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *rows])

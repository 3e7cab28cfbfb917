"""scripts/draft_agreement.py's agreement-by-confidence table: bands (lo, hi], every position in one band."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "draft_agreement.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("draft_agreement", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_position_counts_in_the_band_its_confidence_falls_in(script):
    agree = np.array([True, False, True, True, False, True])
    confidence = np.array([0.3, 0.31, 0.95, 1.0, 0.2, 0.9])
    rows = {r["confidence"]: r for r in script.by_confidence("v", agree, confidence)}
    # 0.3 closes the first band, 0.9 the fourth; 1.0 is in the last; bands with no position are left out
    assert list(rows) == ["(0.0, 0.3]", "(0.3, 0.5]", "(0.7, 0.9]", "(0.9, 1.0]"]
    assert [rows[b]["tokens"] for b in rows] == [2, 1, 1, 2]
    assert sum(r["token_share"] for r in rows.values()) == pytest.approx(1.0)
    assert [rows[b]["agree"] for b in rows] == [0.5, 0.0, 1.0, 1.0]
    ci = binomtest(1, 2).proportion_ci()
    assert (rows["(0.0, 0.3]"]["lo"], rows["(0.0, 0.3]"]["hi"]) == pytest.approx((ci.low, ci.high))

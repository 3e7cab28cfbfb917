"""Serving metrics (specbench.analysis.serving) on hand-made rows with hand-computed values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specbench.analysis import serving

# Two requests of one speculative run (γ = 3; the last round of row 1 drafted 2, as near max_new_tokens)
# plus one autoregressive step that every acceptance metric must ignore.
ROWS = [  # (decoder, row, gamma, accepted)
    ("speculative", 0, 3, 0),
    ("speculative", 0, 3, 1),
    ("speculative", 0, 3, 3),
    ("speculative", 1, 3, 3),
    ("speculative", 1, 3, 2),
    ("speculative", 1, 2, 2),
    ("autoregressive", 0, 0, 0),
]


@pytest.fixture
def rounds() -> pd.DataFrame:
    return pd.DataFrame(ROWS, columns=["decoder", "row", "gamma", "accepted"]).assign(job="j", batch=0, repeat=0)


def test_mean_acceptance_length_is_vllms_definition(rounds):
    out = serving.mean_acceptance_length(rounds)
    assert len(out) == 1 and out["decoder"].item() == "speculative"
    # 1 + Σaccepted / Σrounds = 1 + 11 / 6; the AR step is not a drafting round.
    assert out["rounds"].item() == 6 and out["accepted"].item() == 11
    assert out["mean_acceptance_length"].item() == pytest.approx(1 + 11 / 6)
    assert out["draft_acceptance_rate"].item() == pytest.approx(11 / 17)


def test_per_position_conditional_and_unconditional(rounds):
    out = serving.acceptance_by_position(rounds).set_index("position")
    # position: (drafted, reached, accepted) counted by hand from ROWS
    assert out.loc[1, ["drafted", "reached", "accepted"]].tolist() == [6, 6, 5]
    assert out.loc[2, ["drafted", "reached", "accepted"]].tolist() == [6, 5, 4]
    assert out.loc[3, ["drafted", "reached", "accepted"]].tolist() == [5, 3, 2]
    np.testing.assert_allclose(out["conditional_acceptance"], [5 / 6, 4 / 5, 2 / 3])
    np.testing.assert_allclose(out["unconditional_acceptance"], [5 / 6, 4 / 6, 2 / 5])


def test_unconditional_is_product_of_conditional_when_every_round_drafts_all():
    a = [0, 1, 1, 2, 2, 2, 3, 3]
    df = pd.DataFrame({"gamma": 3, "accepted": a, "row": range(len(a))})
    out = serving.acceptance_by_position(df)
    np.testing.assert_allclose(out["unconditional_acceptance"], np.cumprod(out["conditional_acceptance"]))
    np.testing.assert_allclose(out["unconditional_acceptance"], [7 / 8, 5 / 8, 2 / 8])


def test_histogram_counts_and_fractions(rounds):
    out = serving.acceptance_length_histogram(rounds)
    assert out["acceptance_length"].tolist() == [1, 2, 3, 4]
    assert out["count"].tolist() == [1, 1, 2, 2]
    assert out["count"].sum() == 6
    assert out["fraction"].sum() == pytest.approx(1.0)


def test_per_request_acceptance_and_its_distribution(rounds):
    per = serving.request_acceptance(rounds).set_index("row")
    assert per.loc[0, "acceptance"] == pytest.approx(4 / 9)
    assert per.loc[1, "acceptance"] == pytest.approx(7 / 8)
    summ = serving.request_acceptance_summary(rounds)
    x = np.array([4 / 9, 7 / 8])
    assert summ["requests"].item() == 2
    assert summ["mean"].item() == pytest.approx(x.mean())
    for q in (5, 50, 95):
        assert summ[f"p{q}"].item() == pytest.approx(np.percentile(x, q))
    assert summ["p5"].item() == pytest.approx(4 / 9 + 0.05 * (7 / 8 - 4 / 9))  # linear interpolation


def test_latency_percentiles_match_numpy():
    rng = np.random.default_rng(0)
    n = 50
    new = rng.integers(2, 64, n)
    ttft = rng.uniform(0.01, 0.2, n)
    wall = ttft + new * rng.uniform(0.01, 0.05, n)
    req = pd.DataFrame(
        {"decoder": ["speculative", "autoregressive"] * (n // 2), "new_tokens": new, "ttft": ttft, "wall_time": wall}
    )
    out = serving.latency_percentiles(req)
    assert sorted(out["decoder"].unique()) == ["autoregressive", "speculative"]
    for dec, sub in req.groupby("decoder"):
        values = {
            "ttft": sub["ttft"],
            "tpot": (sub["wall_time"] - sub["ttft"]) / (sub["new_tokens"] - 1),
            "e2e": sub["wall_time"],
        }
        for metric, v in values.items():
            row = out[(out["decoder"] == dec) & (out["metric"] == metric)].iloc[0]
            assert row["n"] == len(v)
            assert row["mean"] == pytest.approx(v.mean())
            np.testing.assert_allclose(row[["p50", "p95", "p99"]].astype(float), np.percentile(v, [50, 95, 99]))


def test_tpot_by_hand_and_single_token_requests_left_out():
    req = pd.DataFrame({"new_tokens": [10, 1, 5, 3], "ttft": [0.1, 0.2, 0.0, 0.5], "wall_time": [1.0, 0.2, 2.0, 0.9]})
    lat = serving.request_latencies(req)
    np.testing.assert_allclose(lat["tpot"].to_numpy(), [0.1, np.nan, 0.5, 0.2])
    out = serving.latency_percentiles(req, by=[]).set_index("metric")
    assert out.loc["tpot", "n"] == 3 and out.loc["ttft", "n"] == 4
    assert out.loc["tpot", "p50"] == pytest.approx(0.2)
    assert serving.latency_percentiles(
        pd.DataFrame({"new_tokens": [1, 2, 3, 4], "ttft": 0.0, "wall_time": [1.0, 2.0, 3.0, 4.0]}), by=[]
    ).set_index("metric").loc["e2e", "p50"] == pytest.approx(2.5)  # documented interpolation: linear


def test_bad_rows_raise_naming_the_problem(rounds):
    bad = rounds.copy()
    bad.loc[0, "accepted"] = 4
    with pytest.raises(ValueError, match=r"accepted=4 with gamma=3"):
        serving.mean_acceptance_length(bad)
    with pytest.raises(ValueError, match="'wall_time'"):
        serving.latency_percentiles(pd.DataFrame({"ttft": [0.1], "new_tokens": [3]}))
    with pytest.raises(ValueError, match="nope"):
        serving.acceptance_by_position(rounds, by="nope")

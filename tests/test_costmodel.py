"""Cost model: formulas against hand-computed values, fits against synthetic rows with
known parameters (seeded), leave-one-out, context extension, what-if, summary."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import optimize, stats

from specbench import costmodel as cm

# ---------------------------------------------------------------- fixtures

ALPHAS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.45)
CD = (0.0010, 0.0030)  # C_d intercept, per token (s)
CT = {"flat": 0.020, "per_token": 0.0015, "knee": 8}
CO = (0.0010, 0.0002)
CO_AR = 0.0005


@pytest.fixture(scope="module")
def sweep():
    return cm.synthetic_sweep(gammas=(1, 2, 3, 4, 5, 6), alphas={"chat": ALPHAS}, drafts={"tiny": CD}, ct=CT, co=CO,
                              co_ar=CO_AR, n_prompts=12, new_tokens=96, seed=11)


@pytest.fixture(scope="module")
def big_acceptance():
    # many rounds at each gamma so that per-position CIs are tight
    return cm.synthetic_sweep(gammas=(2, 4, 6), alphas={"chat": ALPHAS}, drafts={"tiny": CD}, n_prompts=24,
                              new_tokens=160, seed=12)["rounds"]


def _rows(pairs, committed=None):
    """Round rows from (gamma, accepted) pairs."""
    g, a = zip(*pairs)
    df = pd.DataFrame({"gamma": g, "accepted": a, "decoder": cm.SPECULATIVE})
    df["committed"] = committed if committed is not None else df["accepted"] + 1
    return df


# ---------------------------------------------------------------- formulas


def test_expected_accept_length_single_hand_values():
    assert cm.expected_accept_length(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert cm.expected_accept_length(0.8, 3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    assert cm.expected_accept_length(0.0, 5) == 1.0
    assert cm.expected_accept_length(1.0, 4) == 5.0  # exact, no 0/0
    assert cm.expected_accept_length(1.0, 0) == 1.0
    near = cm.expected_accept_length(1 - 1e-9, 4)
    assert math.isfinite(near) and near == pytest.approx(5.0, abs=1e-7)
    v = cm.expected_accept_length(np.array([0.0, 0.5, 1.0]), 2)
    np.testing.assert_allclose(v, [1.0, 1.75, 3.0])
    assert not np.isnan(v).any()
    with pytest.raises(ValueError):
        cm.expected_accept_length(1.2, 3)


def test_expected_accept_length_positional_hand_values():
    assert cm.expected_accept_length_positional([0.8, 0.5], 2) == pytest.approx(1 + 0.8 + 0.8 * 0.5)
    assert cm.expected_accept_length_positional([0.8, 0.5, 0.9], 1) == pytest.approx(1.8)
    assert cm.expected_accept_length_positional([], 0) == 1.0
    assert cm.expected_accept_length_positional([1.0] * 4, 4) == 5.0
    assert cm.expected_accept_length_positional([0.0, 1.0], 2) == 1.0
    # equal alphas: same as the closed form
    assert cm.expected_accept_length_positional([0.7] * 5, 5) == pytest.approx(cm.expected_accept_length(0.7, 5))
    with pytest.raises(ValueError):
        cm.expected_accept_length_positional([0.5], 3)


def test_speedup_and_ideal_hand_values():
    # E[N] = 2.2, C_t1 = 20 ms, C_d = 6 ms, C_t(γ+1) = 25 ms, C_o = 1 ms
    assert cm.speedup_formula(2.2, 0.020, 0.006, 0.025, 0.001) == pytest.approx(2.2 * 0.020 / 0.032)
    assert cm.ideal_speedup(2.2, 0.020, 0.006, 0.025) == pytest.approx(2.2 * 0.020 / 0.031)
    assert cm.ideal_speedup(2.2, 0.020, 0.006, 0.025) > cm.speedup_formula(2.2, 0.020, 0.006, 0.025, 0.001)


def test_position_counts_and_single_alpha_hand_values():
    df = _rows([(3, 0), (3, 2), (3, 3), (1, 1)])
    trials, succ = cm.position_counts(df["accepted"], df["gamma"])
    # pos 1: all 4 tested, 3 passed; pos 2: rows with γ≥2 and a≥1 -> 2, both a≥2;
    # pos 3: γ≥3 and a≥2 -> 2, one a≥3
    assert trials.tolist() == [4, 2, 2]
    assert succ.tolist() == [3, 2, 1]
    acc = cm.acceptance_by_position(df, by=[])
    assert acc["alpha"].tolist() == pytest.approx([0.75, 1.0, 0.5])
    ci = stats.binomtest(3, 4).proportion_ci(method="wilson")
    assert (acc.loc[0, "alpha_lo"], acc.loc[0, "alpha_hi"]) == pytest.approx((ci.low, ci.high))
    fit = cm.fit_alpha(df)
    # Σa = 6, Σ[a<γ] = 2 (rows (3,0) and (3,2))
    assert (fit.successes, fit.trials) == (6, 8)
    assert fit.alpha == pytest.approx(0.75)
    assert fit.lo < 0.75 < fit.hi
    with pytest.raises(ValueError):
        cm.fit_alpha(_rows([(2, 3)]))


def test_single_alpha_is_the_truncated_geometric_mle():
    rng = np.random.default_rng(0)
    g = rng.integers(1, 7, 500)
    a = np.array([min(int(rng.geometric(1 - 0.7)) - 1, gi) for gi in g])
    df = _rows(list(zip(g, a)))

    def nll(al):
        return -(a.sum() * np.log(al) + (a < g).sum() * np.log(1 - al))

    best = optimize.minimize_scalar(nll, bounds=(1e-6, 1 - 1e-6), method="bounded", options={"xatol": 1e-10})
    assert cm.fit_alpha(df).alpha == pytest.approx(best.x, abs=1e-6)
    assert cm.fit_alpha(df).lo < 0.7 < cm.fit_alpha(df).hi


def test_measured_accept_length_uses_accepted_not_committed():
    # the last round was truncated by max_new_tokens: committed 1 although 3 were accepted
    df = _rows([(3, 3), (3, 1)], committed=[1, 2])
    m = cm.measured_accept_length(df, by=[])
    assert m.loc[0, "accept_length"] == pytest.approx((4 + 2) / 2)
    assert m.loc[0, "mean_committed"] == pytest.approx(1.5)


def test_isotonic_and_monotone_curve_hand_values():
    np.testing.assert_allclose(cm.isotonic_increasing([1, 3, 2, 4]), [1, 2.5, 2.5, 4])
    np.testing.assert_allclose(cm.isotonic_increasing([1, 3, 2], [1, 1, 3]), [1, 2.25, 2.25])
    np.testing.assert_allclose(cm.isotonic_increasing([3, 2, 1]), [2, 2, 2])
    ks, ts = [1, 2, 4], [1.0, 1.0, 3.0]
    assert cm.eval_monotone_curve(ks, ts, 3) == pytest.approx(2.0)  # interpolation
    # beyond: anchored at the last point, least-squares slope of the last points: Sxy/Sxx = (30/9)/(42/9) = 5/7
    assert cm.eval_monotone_curve(ks, ts, 6) == pytest.approx(3.0 + 2 * 5 / 7)
    assert cm.eval_monotone_curve([1, 2, 3, 4, 5], [0, 0, 1, 2, 3], 7) == pytest.approx(5.0)
    assert cm.eval_monotone_curve(ks, ts, 0) == pytest.approx(1.0)  # flat below
    assert cm.eval_monotone_curve([2], [7.0], 9) == 7.0
    k, t = cm.fit_monotone_curve([1, 1, 1, 2, 3, 3], [1.0, 2.0, 9.0, 1.0, 4.0, 4.0])
    assert k == [1, 2, 3]
    # medians 2, 1, 4 with counts 3, 1, 2 -> pooled (2*3+1*1)/4 = 1.75
    assert t == pytest.approx([1.75, 1.75, 4.0])


# ---------------------------------------------------------------- recovery of known parameters


def test_per_position_alphas_recovered_within_ci(big_acceptance):
    acc = cm.acceptance_by_position(big_acceptance, by=[])
    assert len(acc) == 6
    inside95 = ((acc["alpha_lo"] <= np.array(ALPHAS)) & (np.array(ALPHAS) <= acc["alpha_hi"])).sum()
    assert inside95 >= 5
    wide = cm.acceptance_by_position(big_acceptance, by=[], confidence=0.999, method="exact")
    assert ((wide["alpha_lo"] <= np.array(ALPHAS)) & (np.array(ALPHAS) <= wide["alpha_hi"])).all()
    # CIs are informative: position 1 much tighter than 0.1
    assert (acc["alpha_hi"] - acc["alpha_lo"]).iloc[0] < 0.05


def test_positional_model_beats_single_alpha_when_alphas_decay(big_acceptance):
    cmp_df = cm.compare_accept_length_models(big_acceptance, by=[])
    verdict = cm.which_accept_length_model(cmp_df)
    assert verdict.loc[0, "better"] == "positional"
    assert verdict.loc[0, "mae_positional"] < 0.5 * verdict.loc[0, "mae_single"]
    # the truth at each gamma
    for _, r in cmp_df.iterrows():
        truth = cm.expected_accept_length_positional(ALPHAS, int(r["gamma"]))
        assert r["pred_positional"] == pytest.approx(truth, rel=0.03)


def test_timing_profile_recovers_known_costs(sweep):
    prof = cm.TimingProfile.from_rounds(sweep["rounds"], sweep["ct"])
    assert prof.ct_source == "ct"
    assert prof.cd_per_token == pytest.approx(CD[1], rel=0.03)
    assert prof.cd_intercept == pytest.approx(CD[0], abs=3e-4)
    assert prof.co_per_token == pytest.approx(CO[1], rel=0.15)
    for g in range(1, 7):
        assert prof.c_o(g) == pytest.approx(CO[0] + CO[1] * g, rel=0.05)
    assert prof.c_o(20) == pytest.approx(CO[0] + CO[1] * 20, rel=0.15)  # from the fit
    assert prof.ct1 == pytest.approx(CT["flat"] + CO_AR, rel=0.02)


def test_monotone_ct_flat_then_rising_with_gaps(sweep):
    ct = sweep["ct"][~sweep["ct"]["k"].isin([10, 11])]  # untried k
    prof = cm.TimingProfile.from_rounds(sweep["rounds"], ct)
    assert np.all(np.diff(prof.ct_t) >= 0)
    assert 10 not in prof.ct_k
    for k in list(range(1, 17)) + [10, 11, 18, 20]:  # tried, interpolated, extrapolated
        truth = float(cm.synthetic_ct_time(k, 1, **CT))
        assert prof.c_t(k) == pytest.approx(truth, rel=0.04), k
    flat = [prof.c_t(k) for k in range(1, 9)]
    assert max(flat) - min(flat) < 0.03 * CT["flat"]


def test_ct_falls_back_to_rounds_without_table(sweep):
    prof = cm.TimingProfile.from_rounds(sweep["rounds"])
    assert prof.ct_source == "rounds"
    assert prof.ct_k == [1, 2, 3, 4, 5, 6, 7]
    for k in (1, 4, 7):
        assert prof.c_t(k) == pytest.approx(float(cm.synthetic_ct_time(k, 1, **CT)), rel=0.03)


def test_timing_profile_refuses_mixed_settings():
    d = cm.synthetic_sweep(gammas=(2,), batch_sizes=(1, 2), n_prompts=4, new_tokens=16, seed=1)
    with pytest.raises(ValueError, match="batch_size"):
        cm.TimingProfile.from_rounds(d["rounds"])
    profs = cm.fit_timing_profiles(d["rounds"], d["ct"])
    assert sorted(k[-1] for k in profs) == [1, 2]


# ---------------------------------------------------------------- speedup: measured, model, LOO


def test_measured_speedup_hand_values():
    base = {"job": "j", "repeat": 0, "gamma": 3}
    rows = []
    for pid, spec_wall, ar_wall in (("p0", 1.0, 2.0), ("p1", 1.0, 3.0), ("p2", 2.0, 3.0)):
        rows.append({**base, "prompt_id": pid, "decoder": cm.SPECULATIVE, "new_tokens": 10, "wall_time": spec_wall,
                     "ttft": 0.1})
        rows.append({**base, "prompt_id": pid, "decoder": cm.AUTOREGRESSIVE, "new_tokens": 10, "wall_time": ar_wall,
                     "ttft": 0.1})
    req = pd.DataFrame(rows)
    m = cm.measured_speedup(req, ["gamma"])
    assert m.loc[0, "speedup"] == pytest.approx(2.0)  # median of 2, 3, 1.5
    assert m.loc[0, "speedup_lo"] <= 2.0 <= m.loc[0, "speedup_hi"]
    assert m.loc[0, "spec_tok_s"] == pytest.approx(30 / 4.0)
    assert m.loc[0, "ar_tok_s"] == pytest.approx(30 / 8.0)
    d = cm.paired_requests(req, basis="decode")
    assert d.loc[0, "ratio"] == pytest.approx((1.9 / 9) / (0.9 / 9))
    with pytest.raises(ValueError):
        cm.paired_requests(pd.concat([req, req[req["decoder"] == cm.AUTOREGRESSIVE]]))


def test_bootstrap_ci_edge_cases():
    assert math.isnan(cm.bootstrap_median_ci([1.5])[1])
    assert cm.bootstrap_median_ci([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)
    med, lo, hi = cm.bootstrap_median_ci(np.random.default_rng(0).normal(1.5, 0.1, 200))
    assert lo < med < hi and hi - lo < 0.1


def test_model_matches_measured_speedup(sweep):
    svm = cm.speedup_vs_model(sweep["rounds"], sweep["requests"], sweep["ct"])
    assert sorted(svm["gamma"]) == [1, 2, 3, 4, 5, 6]
    assert svm["rel_error"].abs().max() < 0.08
    assert (svm["ideal"] > svm["predicted"]).all()
    # the model's optimum is where the measured speedup is (near) largest
    best_measured = int(svm.loc[svm["speedup"].idxmax(), "gamma"])
    assert abs(int(svm["model_gamma"].iloc[0]) - best_measured) <= 1


def test_leave_one_out_small_error_on_consistent_data(sweep):
    for ct in (sweep["ct"], None):
        loo = cm.leave_one_out(sweep["rounds"], sweep["requests"], ct)
        assert len(loo) == 6
        s = cm.loo_summary(loo)
        assert s.loc[0, "median_abs_rel_error"] < 0.04
        assert s.loc[0, "max_abs_rel_error"] < 0.12


def test_context_model_reduces_loo_error_when_simple_model_misses():
    # each gamma's jobs ran at a different context length (not a smooth function of γ);
    # target and draft costs grow with context
    d = cm.synthetic_sweep(gammas=(1, 2, 3, 4, 5, 6), ct={"ctx": 2e-5}, cd_ctx=1e-6,
                           job_context={1: 100, 2: 1500, 3: 200, 4: 1200, 5: 300, 6: 1000},
                           n_prompts=12, new_tokens=96, seed=2)
    cmp_df = cm.compare_context_model(d["rounds"], d["requests"])
    r = cmp_df.iloc[0]
    assert r["simple_median"] > 0.05
    assert r["context_median"] < 0.04
    assert bool(r["context_reduces_error"])
    prof = cm.TimingProfile.from_rounds(d["rounds"])
    assert prof.context.ct_slope == pytest.approx(2e-5, rel=0.1)
    assert prof.context.ct1_slope == pytest.approx(2e-5, rel=0.1)
    assert prof.context.cd_per_token_ctx == pytest.approx(1e-6, rel=0.15)


# ---------------------------------------------------------------- what-if and profiles


def test_what_if_combines_profiles_and_roundtrips_json(tmp_path):
    code = (0.95, 0.9, 0.85, 0.8)
    fast_hw = dict(ct={"flat": 0.008, "per_token": 0.0002, "knee": 32}, co=(0.0004, 0.00005), co_ar=0.0002)
    A = cm.synthetic_sweep(alphas={"code": code}, drafts={"tiny": CD}, n_prompts=12, seed=5)  # acceptance source
    B = cm.synthetic_sweep(alphas={"chat": (0.6, 0.5, 0.4)}, drafts={"tiny": (0.0005, 0.001)}, n_prompts=12,
                           seed=6, hardware="gpu:synthetic", **fast_hw)  # timing source
    acc = cm.AcceptanceProfile.from_rounds(A["rounds"])
    tim = cm.TimingProfile.from_rounds(B["rounds"], B["ct"])
    acc2 = cm.AcceptanceProfile.from_json(acc.to_json(tmp_path / "acc.json"))
    tim2 = cm.TimingProfile.from_json(tim.to_json(tmp_path / "tim.json"))
    assert acc2 == acc
    assert tim2 == tim
    assert tim2.keys["hardware"] == "gpu:synthetic"
    p = cm.predict_speedup(acc2, tim2, range(1, 11))
    # every row is the formula over the combined components
    for _, r in p.iterrows():
        g = int(r["gamma"])
        en = cm.expected_accept_length_positional(acc.alpha_profile(g), g)
        s = en * tim.c_t1() / (tim.c_d(g) + tim.c_t(g + 1) + tim.c_o(g))
        assert r["speedup"] == pytest.approx(s)
        assert r["ideal_speedup"] == pytest.approx(en * tim.c_t1() / (tim.c_d(g) + tim.c_t(g + 1)))
    # positions beyond those measured in A (γ ≤ 6) use A's single-α fit
    assert acc.alpha_at(9) == acc.alpha
    # and it predicts a sweep actually run with A's acceptance on B's hardware
    C = cm.synthetic_sweep(alphas={"code": code}, drafts={"tiny": (0.0005, 0.001)}, n_prompts=12, seed=7, **fast_hw)
    _, req = cm.add_gamma_setting(C["rounds"], C["requests"])
    meas = cm.measured_speedup(req, ["gamma"], basis="decode")
    both = p.merge(meas, on="gamma", suffixes=("_pred", "_meas"))
    rel = both["speedup_pred"] / both["speedup_meas"] - 1
    assert len(both) == 6 and rel.abs().max() < 0.1 and rel.abs().median() < 0.05
    # while B's own acceptance would predict far less
    pb = cm.predict_speedup(cm.AcceptanceProfile.from_rounds(B["rounds"]), tim, [4])
    assert pb.loc[0, "speedup"] < 0.8 * both.loc[both["gamma"] == 4, "speedup_meas"].iloc[0]


def test_optimal_gamma():
    tim = cm.TimingProfile(cd_intercept=0.0, cd_per_token=0.001, ct_k=[1, 16], ct_t=[0.02, 0.02], co_by_gamma={},
                           co_intercept=0.0, co_per_token=0.0, ct1=0.02)
    perfect = cm.AcceptanceProfile(alphas=[1.0], trials=[10], successes=[10], alpha=1.0, alpha_trials=10,
                                   alpha_successes=10)
    g, s = cm.optimal_gamma(perfect, tim, gamma_max=8)
    # S(γ) = (γ+1)·0.02 / (0.001γ + 0.02): increasing in γ
    assert g == 8 and s == pytest.approx(9 * 0.02 / 0.028)
    useless = cm.AcceptanceProfile(alphas=[0.0], trials=[10], successes=[0], alpha=0.0, alpha_trials=10,
                                   alpha_successes=0)
    g, s = cm.optimal_gamma(useless, tim, gamma_max=8)
    assert g == 1 and s == pytest.approx(0.02 / 0.021)


# ---------------------------------------------------------------- summary


def test_summary_table_on_paired_rows(sweep):
    rounds, requests = sweep["rounds"], sweep["requests"]
    summ = cm.summary_table(rounds, requests, by=["gamma"])
    assert summ["gamma"].tolist() == [1, 2, 3, 4, 5, 6]
    sp = cm.spec_rows(rounds)
    g3 = sp[sp["job"].str.endswith("_g3")]
    r3 = summ[summ["gamma"] == 3].iloc[0]
    assert r3["acceptance"] == pytest.approx(g3["accepted"].sum() / g3["gamma"].sum())
    assert r3["accept_length"] == pytest.approx((g3["accepted"] + 1).mean())
    q3 = requests[requests["job"].str.endswith("_g3")]
    spec = q3[q3["decoder"] == cm.SPECULATIVE]
    ar = q3[q3["decoder"] == cm.AUTOREGRESSIVE]
    assert r3["spec_tok_s"] == pytest.approx(spec["new_tokens"].sum() / spec["wall_time"].sum())
    assert r3["ar_tok_s"] == pytest.approx(ar["new_tokens"].sum() / ar["wall_time"].sum())
    assert (summ["speedup_lo"] <= summ["speedup"]).all() and (summ["speedup"] <= summ["speedup_hi"]).all()
    assert (summ["speedup"] > 1.2).all() and (summ["n_prompts"] == 12).all()
    text = cm.format_summary(cm.summary_table(rounds, requests))
    assert "speedup [95% CI]" in text and "×" in text
    assert len(text.splitlines()) == 1 + 1 + 6  # constant keys line, header, 6 settings

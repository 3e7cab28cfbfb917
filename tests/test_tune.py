"""specbench.tune: config validation, studies that resume, two workers on one storage, the
recommendation table. Real decoder runs on the tiny shape-only pair (seconds); no mocks."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
from conftest import EAGER, eager_cli
from hydra import compose, initialize_config_dir
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial
from scipy import stats

from specbench.app import CONF_DIR, to_config
from specbench.bench.job import encode_workload, run_job
from specbench.bench.protocol import CT_KEYS
from specbench.bench.runstore import load_sweep
from specbench.config import TuneConfig
from specbench.models import pair as pair_module
from specbench.tune.objectives import OBJECTIVES, Objective
from specbench.tune.paired import compact, objective_value, paired_p, reference_throughput
from specbench.tune.profile import model_choice
from specbench.tune.recommend import REC_COLUMNS, format_table, recommendation_table, write_recommendations
from specbench.tune.runner import Runner, run_tune
from specbench.tune.samplers import Arm, SearchSpace, neighbours, policy_choices
from specbench.tune.study import PairedPruner, open_storage, plan_studies

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "+tune=gamma",
    "pair=tiny",
    "draft=model",
    "workload=synthetic",
    "workload.n_prompts=2",
    "workload.prompt_tokens=16",
    "max_new_tokens=8",
    "tune.gamma_max=4",
]


def compose_config(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return to_config(compose(config_name="config", overrides=[EAGER, *overrides]))


def finished(study) -> list:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "override, expect",
    [
        ("tune.gamma_max=0", ["tune.gamma_max=0", "integer >= 1"]),
        ("tune.drafts=[]", ["tune.drafts=[]", "'model', 'w8a16', 'w4a16', 'w4a16h8', 'ngram'"]),
        ("tune.drafts=[eagle]", ["tune.drafts=['eagle']", "'eagle'", "'model', 'w8a16', 'w4a16', 'w4a16h8', 'ngram'"]),
        (
            "tune.objective=speedup",
            [
                "tune.objective='speedup'",
                "'throughput', 'throughput_speedup', 'latency_speedup', 'latency_mean', 'latency_p95'",
            ],
        ),
        ("tune.sampler=cmaes", ["tune.sampler='cmaes'", "'local', 'tpe', 'random', 'grid'"]),
        ("tune.prune_margin=1.5", ["tune.prune_margin=1.5", "[0, 1)"]),
        ("tune.prune_alpha=0", ["tune.prune_alpha=0", "(0, 1)"]),
        ("tune.prune_after=1", ["tune.prune_after=1", "integer >= 2"]),
    ],
)
def test_bad_search_space_fails_before_any_model_loads(override, expect):
    loads = pair_module._load.cache_info().misses
    with pytest.raises(ValueError) as info:
        compose_config(["+tune=gamma", override])
    for text in expect:
        assert text in str(info.value), str(info.value)
    assert pair_module._load.cache_info().misses == loads


def test_draft_kind_the_pair_cannot_serve_is_rejected():
    with pytest.raises(
        ValueError, match=r"tune.drafts=\['w8a16', 'model'\].*pair.draft.*'w8a16', 'w4a16', 'w4a16h8', 'ngram'"
    ):
        compose_config(["+tune=gamma", "pair=embedded", "tune.drafts=[w8a16,model]"])
    assert TuneConfig().enabled is False and compose_config([]).tune.enabled is False


def test_cli_reports_bad_config_without_traceback(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "specbench", "+tune=gamma", "tune.gamma_max=0", f"runs_dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "tune.gamma_max=0" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "tune" / "optuna.db").exists()


# --------------------------------------------------------------------------- a study that resumes


def test_study_runs_resumes_and_enqueues_the_cost_model_gamma_first(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    base = TINY + [f"runs_dir={tmp_path}", f"tune.storage={url}", "tune.sampler=random"]
    run_tune(compose_config(base + ["tune.n_trials=2"]), tmp_path / "run1")
    (study,) = [optuna.load_study(study_name=n, storage=url) for n in optuna.get_all_study_names(url)]
    assert len(finished(study)) == 2
    model = study.user_attrs["model"]
    t0 = study.trials[0]
    assert t0.user_attrs["source"] == "cost_model"
    assert t0.params == {"draft": model["draft"], "gamma": model["gamma"]}
    assert 1 <= model["gamma"] <= 4 and model["source"] == "profile"
    rows = pd.DataFrame(t0.user_attrs["requests"])  # the trial's request rows, both decoders
    assert set(rows["batch"]) == {0, 1} and set(rows["decoder"]) == {"autoregressive", "speculative"}
    # Trials go through the jobs' protocol: the same labelled rows, telemetry, and C_t(k) keys.
    study_dir = next((tmp_path / "run1" / "trials").iterdir())
    trial_rows = pd.read_parquet(study_dir / "trial-0000" / "requests.parquet")
    assert {"prompt_id", "category", "gamma_setting", "draft_kind", "repeat", "batch"} <= set(trial_rows.columns)
    assert set(trial_rows.loc[trial_rows.decoder == "speculative", "gamma_setting"]) == {model["gamma"]}
    assert (study_dir / "trial-0000" / "telemetry.json").is_file()
    assert set(CT_KEYS) <= set(pd.read_parquet(study_dir / "profile-ct-model" / "ct.parquet").columns)
    # The profile's reference throughput is the batch-wall definition.
    profile = pd.read_parquet(study_dir / "profile-model" / "requests.parquet")
    assert study.user_attrs["reference"]["ar_tok_s"] == pytest.approx(reference_throughput(profile))

    run_tune(compose_config(base + ["tune.n_trials=4"]), tmp_path / "run2")
    study = optuna.load_study(study_name=study.study_name, storage=url)
    assert len(finished(study)) == 4
    (summary,) = [json.loads(p.read_text()) for p in (tmp_path / "run2").glob("tune_run-*.json")]
    (res,) = summary["studies"]
    assert len(res["trials_run"]) == 2 and res["profile_s"] == 0.0  # only the remainder; no new profile
    assert sum(t.user_attrs.get("source") == "cost_model" for t in study.trials) == 1
    assert study.user_attrs["model"] == model
    for name in ("recommendations.csv", "recommendations.json", "recommendations.md"):
        assert (tmp_path / "run2" / name).is_file()
    assert any((tmp_path / "run2" / "trials").rglob("requests.parquet"))  # raw rows in the run store


# --------------------------------------------------------------------------- two workers


def test_two_workers_share_one_journal_study(tmp_path):
    journal = tmp_path / "optuna.journal"
    args = TINY + [
        "workload.n_prompts=3",
        "max_new_tokens=24",
        "tune.n_trials=10",
        "tune.sampler=random",
        "tune.prune=false",
        f"tune.storage=journal:{journal}",
        f"runs_dir={tmp_path}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    procs = [
        subprocess.Popen(
            eager_cli(*args, f"hydra.run.dir={tmp_path / f'w{i}'}"),
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)

    storage = open_storage(f"journal:{journal}")
    (name,) = optuna.get_all_study_names(storage)
    study = optuna.load_study(study_name=name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    assert [t.number for t in trials] == list(range(len(trials)))
    assert len(finished(study)) >= 10 and all(t.state == TrialState.COMPLETE for t in trials)
    enqueued = [t for t in trials if t.user_attrs.get("source") == "cost_model"]
    assert [t.number for t in enqueued] == [0]  # one cost-model trial, whoever created the study
    runs = [json.loads(next((tmp_path / f"w{i}").glob("tune_run-*.json")).read_text()) for i in range(2)]
    mine = [set(r["studies"][0]["trials_run"]) for r in runs]
    assert mine[0].isdisjoint(mine[1]) and mine[0] | mine[1] == {t.number for t in trials}
    assert {t.user_attrs["worker"] for t in trials} <= {r["worker"] for r in runs}


# --------------------------------------------------------------------------- the table and the paired test


def _requests(speedups: list[float], ar_wall: float = 8.0, tokens: int = 64) -> dict:
    """Stored request rows of a B=1 trial: per batch b, an AR row and a speculative row `speedups[b]` faster."""
    rows = []
    for b, s in enumerate(speedups):
        for dec, wall in (("autoregressive", ar_wall), ("speculative", ar_wall / s)):
            rows.append(
                {
                    "decoder": dec,
                    "repeat": 0,
                    "batch": b,
                    "row": 0,
                    "prompt_id": f"p{b}",
                    "new_tokens": tokens,
                    "wall_time": wall,
                    "ttft": 0.1,
                }
            )
    return compact(pd.DataFrame(rows))


def _synthetic_study(per_gamma: dict[int, list[float]]):
    study = optuna.create_study(direction="maximize")
    ref = {"ar_tok_s": 8.0, "ar_latency": 0.125}
    for k, v in {
        "specbench_tune": 1,
        "objective": "throughput",
        "reference": ref,
        "workload": "builtin",
        "categories": "summarization",
        "batch_size": 1,
        "sampling": "greedy",
        "model": {"gamma": 4, "speedup": 1.6, "decode_s": 3.0},
    }.items():
        study.set_user_attr(k, v)
    dist = {"draft": CategoricalDistribution(["w8a16"]), "gamma": IntDistribution(1, 8)}
    for g, speedups in per_gamma.items():
        study.add_trial(
            create_trial(
                params={"draft": "w8a16", "gamma": g},
                distributions=dist,
                value=8.0 * float(np.median(speedups)),
                user_attrs={"requests": _requests(speedups), "decode_s": 20.0},
            )
        )
    return study


def test_recommendation_flags_indistinguishable_gammas(tmp_path):
    study = _synthetic_study(
        {
            2: [1.10, 1.12, 1.08, 1.11, 1.09, 1.13, 1.10, 1.12],
            4: [1.50, 1.55, 1.60, 1.52, 1.57, 1.49, 1.56, 1.53],
            5: [1.53, 1.49, 1.58, 1.56, 1.55, 1.52, 1.54, 1.57],
        }
    )
    table = recommendation_table([study])
    assert list(table.columns[: len(REC_COLUMNS)]) == REC_COLUMNS
    (row,) = table.to_dict(orient="records")
    assert row["draft"] == "w8a16" and row["gamma"] == 5  # best median of the per-batch values
    assert row["throughput_speedup_lo"] <= row["throughput_speedup"] <= row["throughput_speedup_hi"]
    assert row["verdict"] == "faster" and row["latency_speedup"] == pytest.approx(row["throughput_speedup"])  # B=1
    assert row["deploy"] == "γ=5"
    assert row["ar_tok_s"] == pytest.approx(8.0) and row["tok_s"] == pytest.approx(row["throughput_speedup"] * 8.0)
    assert row["n_trials"] == 3 and row["n_complete"] == 3 and row["model_gamma"] == 4
    assert row["indistinguishable"].startswith("γ=5 ≈ γ=4 (p=") and "γ=2" not in row["indistinguishable"]
    assert [a["gamma"] for a in row["alternatives"]] == [4] and row["alternatives"][0]["p"] > 0.05
    assert row["decode_s"] == pytest.approx(3.0 + 3 * 20.0)
    write_recommendations(table, tmp_path)
    assert json.loads((tmp_path / "recommendations.json").read_text())[0]["gamma"] == 5
    md = (tmp_path / "recommendations.md").read_text()
    assert "γ=5 ≈ γ=4" in md and "throughput speedup" in md and "latency speedup" in md
    assert (tmp_path / "recommendations.csv").read_text().splitlines()[0].split(",")[: len(REC_COLUMNS)] == REC_COLUMNS


def test_uniformly_slower_alternative_is_not_called_indistinguishable():
    """Issue 10, defect 3: 7% slower on every one of 7 batches is a real difference. An unpaired
    test on per-batch values (batches differ a lot from each other) called it '≈' with p = 0.54."""
    best = [1.20, 1.50, 1.30, 1.70, 1.40, 1.60, 1.25]
    (row,) = recommendation_table([_synthetic_study({4: best, 3: [0.93 * s for s in best]})]).to_dict("records")
    assert row["gamma"] == 4
    assert row["indistinguishable"] == "" and row["alternatives"] == []
    assert paired_p(dict(enumerate(best)), {b: 0.93 * s for b, s in enumerate(best)}) < 0.05


def _prune_rate(
    shift: float, sigma: float, sims: int, seed: int, n_batches: int = 8, margin: float = 0.03, alpha: float = 0.05
) -> float:
    """Fraction of simulated trials the paired pruner prunes: per-batch speedups = the best's × exp(shift + noise)."""
    rng = np.random.default_rng(seed)
    pruned = 0
    for _ in range(sims):
        study = optuna.create_study(direction="maximize", pruner=PairedPruner(margin, alpha, 2, n_batches))
        base = rng.uniform(1.0, 2.0, n_batches)  # batches differ far more than the configurations do
        best = study.ask()
        for step, v in enumerate(base):
            best.report(float(v), step)
        study.tell(best, float(np.median(base)))
        trial = study.ask()
        for step in range(n_batches - 1):  # the last batch is never a look: the trial is done then
            trial.report(float(base[step] * np.exp(shift + rng.normal(0.0, sigma))), step)
            if trial.should_prune():
                pruned += 1
                break
        study.tell(trial, 0.0)
    return pruned / sims


def test_pruner_keeps_its_stated_error_rate():
    """Issue 10, defect 3: a trial equal to the best (or exactly `prune_margin` worse, the worst
    case of "not worse by more than the margin") is pruned at most at tune.prune_alpha = 5%.
    The old rule (median ratio < 0.97 after 2 batches) pruned a third of the equal ones."""
    sims = 300
    for shift in (0.0, math.log(0.97)):
        rate = _prune_rate(shift, sigma=0.05, sims=sims, seed=1)
        assert stats.binomtest(round(rate * sims), sims, 0.05, alternative="greater").pvalue > 0.01, (shift, rate)
    assert _prune_rate(math.log(0.80), sigma=0.02, sims=50, seed=2) > 0.9  # clearly worse: pruned


def test_prior_sweep_reference_is_the_batch_throughput(tmp_path):
    """Issue 10, defect 4: with tune.prior_sweep the reference AR tokens/s was Σ tokens ÷ Σ
    per-request walls (≈ B× too low); it must be the profile's definition, Σ batch tokens ÷ Σ batch walls."""
    job = [
        "pair=tiny",
        "draft=model",
        "workload=synthetic",
        "workload.n_prompts=8",
        "workload.prompt_tokens=16",
        "max_new_tokens=8",
        "batch_size=4",
        "gamma=2",
        "warmup=0",
    ]
    assert run_job(compose_config(job), tmp_path / "sweep" / "g2")
    cfg = compose_config(["+tune=gamma", *job, f"tune.prior_sweep={tmp_path / 'sweep'}", "tune.gamma_max=3"])
    runner = Runner(cfg, tmp_path / "tune")
    (spec,) = plan_studies(cfg, encode_workload(cfg, runner.pair("model")))
    model, reference = model_choice(cfg, spec, runner)[:2]
    assert model["source"].startswith("prior_sweep")

    requests = load_sweep(tmp_path / "sweep", "requests")
    ar = requests[requests.decoder == "autoregressive"]
    batch_wall = ar.groupby(["repeat", "batch"])["wall_time"].max().sum()
    assert reference["ar_tok_s"] == pytest.approx(ar["new_tokens"].sum() / batch_wall)
    assert reference["ar_tok_s"] == pytest.approx(reference_throughput(requests))  # the profile's definition
    assert ar["wall_time"].sum() > 2 * batch_wall  # the rows of a B=4 batch overlap: per-request walls over-count


def test_a_new_objective_needs_one_registration():
    OBJECTIVES.register("toy_min_speedup", Objective("maximize", "x", "throughput_speedup", lambda s: float(np.min(s))))
    try:
        assert TuneConfig(objective="toy_min_speedup").objective == "toy_min_speedup"
        rows = pd.DataFrame(_requests([1.5, 1.2, 1.8]))
        assert objective_value(rows.assign(job="t"), "toy_min_speedup", {}) == pytest.approx(1.2)
    finally:
        OBJECTIVES.unregister("toy_min_speedup")


def test_study_searches_draft_length_policies(tmp_path):
    """tune.policies: each trial draws a policy (and tau, for one that reads it); its rows record the decisions."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    base = TINY + [f"runs_dir={tmp_path}", f"tune.storage={url}", "tune.sampler=random", "sampling=t1"]
    run_tune(compose_config(base + ["tune.n_trials=4", "tune.policies=[confidence_stop,schedule]"]), tmp_path / "r")
    (study,) = [optuna.load_study(study_name=n, storage=url) for n in optuna.get_all_study_names(url)]
    drawn = [t for t in study.trials if t.user_attrs.get("source") != "cost_model"]
    assert drawn and all(t.params["policy"] in ("fixed", "confidence_stop", "schedule") for t in drawn)
    assert all(("tau" in t.params) == (t.params["policy"] == "confidence_stop") for t in drawn)
    study_dir = next((tmp_path / "r" / "trials").iterdir())
    rounds = pd.concat(pd.read_parquet(p) for p in study_dir.glob("trial-*/rounds.parquet"))
    spec = rounds[rounds.decoder == "speculative"]
    assert (spec["drafted"] <= spec["gamma"]).all() and set(spec["stop"]) <= {"gamma", "confidence"}
    with pytest.raises(ValueError, match="tune.policies: 'prune_naive' is not lossless"):
        TuneConfig(policies=["prune_naive"])


def test_the_default_local_search_searches_policies(tmp_path):
    """Issue 38: with tune.policies the default sampler (local) failed every trial with KeyError: 'policy'
    (its proposals named only draft and γ). Now trial 0 is the cost model's γ at the fixed policy, and the
    climb proposes the other policies at that γ, a threshold policy at the model's tau* (γ_max 1: no γ
    neighbour, so the three arms are the same whichever measured fastest)."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    base = TINY + [f"runs_dir={tmp_path}", f"tune.storage={url}", "sampling=t1", "tune.n_trials=3"]
    base += ["tune.gamma_max=1", "tune.profile_gamma=1"]
    run_tune(compose_config(base + ["tune.policies=[confidence_stop,schedule]"]), tmp_path / "r")
    (study,) = [optuna.load_study(study_name=n, storage=url) for n in optuna.get_all_study_names(url)]
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(done) == 3 and done[0].params["policy"] == "fixed"
    assert [t.params["policy"] for t in done] == ["fixed", "confidence_stop", "schedule"]
    tau_star = study.user_attrs["model"]["fits"]["model"]["tau_star"]["confidence_stop"]
    (cs,) = [t for t in done if t.params["policy"] == "confidence_stop"]
    assert cs.params["tau"] == pytest.approx(tau_star)
    rec = json.loads((tmp_path / "r" / "recommendations.json").read_text())[0]
    assert rec["best_fixed"].startswith("model γ=") and rec["policy_vs_fixed_n"] == 2


def test_neighbours_of_an_arm_span_gamma_drafts_policies_and_tau():
    space = SearchSpace(["w8a16", "ngram"], 8, policy_choices(["schedule", "confidence_stop"]))
    assert space.policies == ["fixed", "schedule", "confidence_stop"]
    got = neighbours(Arm("w8a16", 4, "confidence_stop", 0.4), space, {"confidence_stop": 0.3})
    assert got == [
        Arm("w8a16", 5, "confidence_stop", 0.4),
        Arm("w8a16", 3, "confidence_stop", 0.4),
        Arm("ngram", 4, "confidence_stop", 0.4),
        Arm("w8a16", 4, "fixed", None),
        Arm("w8a16", 4, "schedule", None),
        Arm("w8a16", 4, "confidence_stop", 0.5),
        Arm("w8a16", 4, "confidence_stop", 0.3),
    ]
    assert Arm("w8a16", 4, "fixed", None)._replace(gamma=1) in neighbours(Arm("w8a16", 2, "fixed"), space, {})
    assert neighbours(Arm("w8a16", 4, "fixed"), space, {"confidence_stop": 0.33})[-1].tau == 0.35  # on tau's grid


def _arm_trial(params: dict, speedups: list[float]):
    dist = {
        "draft": CategoricalDistribution(["w8a16"]),
        "gamma": IntDistribution(1, 8),
        "policy": CategoricalDistribution(["fixed", "confidence_stop"]),
        "tau": FloatDistribution(0.05, 0.95, step=0.05),
    }
    return create_trial(
        params=params,
        distributions={k: dist[k] for k in params},
        value=8.0 * float(np.median(speedups)),
        user_attrs={"requests": _requests(speedups), "decode_s": 1.0},
    )


def test_recommendation_pairs_the_best_policy_with_the_best_fixed_gamma():
    """Arms at one γ with different policies are not pooled: the best fixed γ and the best policy arm are
    compared batch by batch (ratio median, exact CI, Wilcoxon p, n)."""
    study = _synthetic_study({})
    fixed4 = [1.20, 1.50, 1.30, 1.70, 1.40, 1.60, 1.25, 1.45]
    study.add_trial(_arm_trial({"draft": "w8a16", "gamma": 4, "policy": "fixed"}, fixed4))
    study.add_trial(_arm_trial({"draft": "w8a16", "gamma": 3, "policy": "fixed"}, [0.9 * s for s in fixed4]))
    policy = {"draft": "w8a16", "gamma": 4, "policy": "confidence_stop", "tau": 0.4}
    study.add_trial(_arm_trial(policy, [1.08 * s for s in fixed4]))
    (row,) = recommendation_table([study]).to_dict("records")
    assert (row["gamma"], row["policy"], row["tau"]) == (4, "confidence_stop", 0.4)
    assert row["best_fixed"] == "w8a16 γ=4" and row["best_policy"] == "w8a16 γ=4 confidence_stop@0.4"
    assert row["policy_vs_fixed"] == pytest.approx(1.08) and row["policy_vs_fixed_n"] == 8
    assert row["policy_vs_fixed_lo"] == pytest.approx(1.08) == pytest.approx(row["policy_vs_fixed_hi"])
    assert row["policy_vs_fixed_p"] < 0.05
    assert "confidence_stop@0.4 / w8a16 γ=4: 1.08×" in format_table(pd.DataFrame([row]))

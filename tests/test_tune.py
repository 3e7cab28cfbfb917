"""specbench.tune: config validation, studies that resume, two workers on one storage, the
recommendation table. Real decoder runs on the tiny shape-only pair (seconds); no mocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from hydra import compose, initialize_config_dir
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from specbench.models import pair as pair_module
from specbench.app import CONF_DIR, to_config
from specbench.tune import (
    REC_COLUMNS,
    TuneConfig,
    _make_pruner,
    compare,
    open_storage,
    recommendation_table,
    run_tune,
    write_recommendations,
)

REPO = Path(__file__).resolve().parents[1]
TINY = ["+tune=gamma", "pair=tiny", "draft=model", "workload=synthetic", "workload.n_prompts=2",
        "workload.prompt_tokens=16", "max_new_tokens=8", "tune.gamma_max=4"]  # fmt: skip


def compose_config(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return to_config(compose(config_name="config", overrides=overrides))


def finished(study) -> list:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "override, expect",
    [
        ("tune.gamma_max=0", ["tune.gamma_max=0", "integer >= 1"]),
        ("tune.drafts=[]", ["tune.drafts=[]", "'model', 'w8a16', 'ngram'"]),
        ("tune.drafts=[eagle]", ["tune.drafts=['eagle']", "'eagle'", "'model', 'w8a16', 'ngram'"]),
        ("tune.objective=fast", ["tune.objective='fast'", "'throughput', 'speedup', 'latency_mean', 'latency_p95'"]),
        ("tune.sampler=cmaes", ["tune.sampler='cmaes'", "'local', 'tpe', 'random', 'grid'"]),
        ("tune.prune_margin=1.5", ["tune.prune_margin=1.5", "[0, 1)"]),
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
    with pytest.raises(ValueError, match=r"tune.drafts=\['w8a16', 'model'\].*pair.draft.*'w8a16', 'ngram'"):
        compose_config(["+tune=gamma", "pair=embedded", "tune.drafts=[w8a16,model]"])
    assert TuneConfig().enabled is False and compose_config([]).tune.enabled is False


def test_cli_reports_bad_config_without_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "specbench", "+tune=gamma", "tune.gamma_max=0", f"runs_dir={tmp_path}"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
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
    batches = t0.user_attrs["batches"]  # raw per-batch measurements, both decoders
    assert {b["batch"] for b in batches} == {0, 1} and all(b["ar"]["wall_time"] and b["spec"]["new_tokens"] for b in batches)

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
    args = TINY + ["workload.n_prompts=3", "max_new_tokens=24", "tune.n_trials=10", "tune.sampler=random",
                   "tune.prune=false", f"tune.storage=journal:{journal}", f"runs_dir={tmp_path}"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "specbench", *args, f"hydra.run.dir={tmp_path / f'w{i}'}"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]  # fmt: skip
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


# --------------------------------------------------------------------------- pruning and the table


def _record(batch: int, speedup: float, ar_wall: float = 8.0, tokens: int = 64) -> dict:
    return {"batch": batch, "repeat": 0, "prompt_ids": [f"p{batch}"], "first": "autoregressive",
            "spec": {"new_tokens": [tokens], "wall_time": [ar_wall / speedup], "ttft": [0.1]},
            "ar": {"new_tokens": [tokens], "wall_time": [ar_wall], "ttft": [0.1]},
            "rounds": 10, "drafted": 40, "accepted": 36}  # fmt: skip


def _synthetic_study(per_gamma: dict[int, list[float]]):
    study = optuna.create_study(direction="maximize")
    ref = {"ar_tok_s": 8.0, "ar_latency": 0.125}
    for k, v in {"specbench_tune": 1, "objective": "throughput", "reference": ref, "workload": "builtin",
                 "categories": "summarization", "batch_size": 1, "sampling": "greedy",
                 "model": {"gamma": 4, "speedup": 1.6, "decode_s": 3.0}}.items():  # fmt: skip
        study.set_user_attr(k, v)
    dist = {"draft": CategoricalDistribution(["w8a16"]), "gamma": IntDistribution(1, 8)}
    for g, speedups in per_gamma.items():
        recs = [_record(i, s) for i, s in enumerate(speedups)]
        study.add_trial(create_trial(params={"draft": "w8a16", "gamma": g}, distributions=dist,
                                     value=8.0 * sorted(speedups)[len(speedups) // 2],
                                     user_attrs={"batches": recs, "decode_s": 20.0}))  # fmt: skip
    return study


def test_recommendation_flags_indistinguishable_gammas(tmp_path):
    study = _synthetic_study({2: [1.10, 1.12, 1.08, 1.11], 4: [1.50, 1.55, 1.60, 1.52], 5: [1.53, 1.49, 1.58, 1.56]})
    table = recommendation_table([study])
    assert list(table.columns[: len(REC_COLUMNS)]) == REC_COLUMNS
    (row,) = table.to_dict(orient="records")
    assert row["draft"] == "w8a16" and row["gamma"] == 5  # best median of the per-batch values
    assert row["speedup_lo"] <= row["speedup"] <= row["speedup_hi"] and row["verdict"] == "faster"
    assert row["tok_s"] == pytest.approx(row["speedup"] * 8.0)
    assert row["n_trials"] == 3 and row["n_complete"] == 3 and row["model_gamma"] == 4
    assert row["indistinguishable"].startswith("γ=5 ≈ γ=4 (p=") and "γ=2" not in row["indistinguishable"]
    assert [a["gamma"] for a in row["alternatives"]] == [4] and row["alternatives"][0]["p"] > 0.05
    assert row["decode_s"] == pytest.approx(3.0 + 3 * 20.0)
    assert compare([1.10, 1.12, 1.08, 1.11], [1.50, 1.55, 1.60, 1.52]) < 0.05  # fully separated: distinguishable
    write_recommendations(table, tmp_path)
    assert json.loads((tmp_path / "recommendations.json").read_text())[0]["gamma"] == 5
    assert "γ=5 ≈ γ=4" in (tmp_path / "recommendations.md").read_text()
    assert (tmp_path / "recommendations.csv").read_text().splitlines()[0].split(",")[: len(REC_COLUMNS)] == REC_COLUMNS


def test_pruner_compares_on_the_same_batches():
    study = optuna.create_study(direction="maximize", pruner=_make_pruner(0.10, 1, "maximize", True))
    best = study.ask()
    for step, v in enumerate([10.0, 12.0, 11.0]):
        best.report(v, step)
    study.tell(best, 11.0)
    bad, close = study.ask(), study.ask()
    bad.report(8.5, 0)  # 15% worse on batch 0
    close.report(9.5, 0)  # 5% worse: within noise, keep measuring
    assert bad.should_prune() and not close.should_prune()
    close.report(13.0, 1)
    assert not close.should_prune()

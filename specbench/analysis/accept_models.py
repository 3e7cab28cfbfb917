"""Which E[N] model describes the data: measured accept length per γ against the single-α and
the per-position predictions, and an out-of-sample choice between the two (cross-validated
log-likelihood of held-out rounds, so the positional model's extra parameters do not win by
fitting noise)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from specbench.analysis.acceptance import AcceptanceProfile, check_acceptance, position_counts
from specbench.analysis.rows import ACCEPTANCE_KEYS, group_keys, iter_groups, match_rows, spec_rows


def measured_accept_length(rounds: pd.DataFrame, by=None, confidence: float = 0.95) -> pd.DataFrame:
    """Measured E[N] = mean(accepted + 1) per group and row gamma, with a t-interval.

    Columns: by + [gamma, n_rounds, accept_length, accept_length_lo, accept_length_hi,
    mean_committed]. mean_committed (truncated at EOS/max_new_tokens) is shown for contrast.
    """
    sp = spec_rows(rounds)
    keys = [k for k in group_keys(sp, by, ACCEPTANCE_KEYS) if k != "gamma"]
    out = []
    for kd, sub in iter_groups(sp, keys + ["gamma"]):
        n = len(sub)
        x = sub["accepted"].to_numpy(float) + 1.0
        m = float(x.mean())
        if n > 1 and x.std(ddof=1) > 0:
            h = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
        else:
            h = 0.0 if n > 1 else math.nan
        out.append(
            {
                **kd,
                "gamma": int(kd["gamma"]),
                "n_rounds": n,
                "accept_length": m,
                "accept_length_lo": m - h,
                "accept_length_hi": m + h,
                "mean_committed": float(sub["committed"].mean()),
            }
        )
    cols = keys + ["gamma", "n_rounds", "accept_length", "accept_length_lo", "accept_length_hi", "mean_committed"]
    return pd.DataFrame(out, columns=cols)


def compare_accept_length_models(rounds: pd.DataFrame, by=None) -> pd.DataFrame:
    """Measured E[N] per row gamma vs the single-α and the per-position predictions, both
    fitted on all rows of the group (in sample: a description for plots; which model to
    trust is `which_accept_length_model`'s out-of-sample decision).

    Columns: by + measured_accept_length's + [pred_single, pred_positional, err_single,
    err_positional] (err = predicted − measured).
    """
    sp = spec_rows(rounds)
    keys = [k for k in group_keys(sp, by, ACCEPTANCE_KEYS) if k != "gamma"]
    meas = measured_accept_length(sp, keys)
    rows = []
    for kd, sub in iter_groups(sp, keys):
        prof = AcceptanceProfile.from_rounds(sub)
        for _, r in meas[match_rows(meas, kd)].iterrows():
            g = int(r["gamma"])
            ps, pp = prof.accept_length(g, "single"), prof.accept_length(g, "positional")
            rows.append(
                {
                    **r.to_dict(),
                    "pred_single": ps,
                    "pred_positional": pp,
                    "err_single": ps - r["accept_length"],
                    "err_positional": pp - r["accept_length"],
                }
            )
    cols = list(meas.columns) + ["pred_single", "pred_positional", "err_single", "err_positional"]
    return pd.DataFrame(rows, columns=cols)


def _smoothed(successes, trials) -> np.ndarray:
    """(s + ½)/(t + 1): keeps held-out log-likelihoods finite where training saw only passes or only fails."""
    return (np.asarray(successes, float) + 0.5) / (np.asarray(trials, float) + 1.0)


def heldout_loglik(train: pd.DataFrame, test: pd.DataFrame) -> tuple[float, float]:
    """(single-α, per-position) log-likelihood of the test rounds' accept counts under the two
    models fitted on the train rounds. A round passes positions 1..a and fails a+1 if a < γ;
    positions the train rows never tested use the single α."""
    tt, ts = position_counts(train["accepted"], train["gamma"])
    et, es = position_counts(test["accepted"], test["gamma"])
    ef = et - es  # failures per position in the test rounds
    single = float(_smoothed(ts.sum(), tt.sum()))
    pos = np.full(len(et), single)
    known = min(len(tt), len(et))
    pos[:known] = np.where(tt[:known] > 0, _smoothed(ts[:known], tt[:known]), single)
    ll_single = float(es.sum() * math.log(single) + ef.sum() * math.log(1 - single))
    ll_pos = float((es * np.log(pos) + ef * np.log(1 - pos)).sum())
    return ll_single, ll_pos


def which_accept_length_model(rounds: pd.DataFrame, by=None, *, folds: int = 5, seed: int = 0) -> pd.DataFrame:
    """Per group: the E[N] model with the larger cross-validated log-likelihood of held-out rounds.

    Rounds are split into `folds` folds by prompt (`prompt_id`, so a prompt's correlated rounds
    stay together) where there are enough prompts, else by round. Columns: by + [n_rounds,
    n_positions, loglik_single, loglik_positional (held-out, per round), better].
    """
    sp = spec_rows(rounds)
    check_acceptance(sp)
    if folds < 2:
        raise ValueError(f"folds must be >= 2, got {folds}")
    keys = [k for k in group_keys(sp, by, ACCEPTANCE_KEYS) if k != "gamma"]
    rng = np.random.default_rng(seed)
    out = []
    for kd, sub in iter_groups(sp, keys):
        units = sub["prompt_id"].astype(str).to_numpy() if "prompt_id" in sub.columns else None
        if units is None or len(np.unique(units)) < folds:
            units = np.arange(len(sub)).astype(str)
        uniq = np.unique(units)
        fold_of = dict(zip(uniq, rng.permutation(len(uniq)) % folds))
        fold = np.array([fold_of[u] for u in units])
        lls, llp = 0.0, 0.0
        for f in range(folds):
            if (fold == f).all() or not (fold == f).any():
                continue
            s, p = heldout_loglik(sub[fold != f], sub[fold == f])
            lls, llp = lls + s, llp + p
        n = len(sub)
        out.append(
            {
                **kd,
                "n_rounds": n,
                "n_positions": int(sub["gamma"].max()) if n else 0,
                "loglik_single": lls / n if n else math.nan,
                "loglik_positional": llp / n if n else math.nan,
                "better": "positional" if llp > lls else "single",
            }
        )
    cols = keys + ["n_rounds", "n_positions", "loglik_single", "loglik_positional", "better"]
    return pd.DataFrame(out, columns=cols)

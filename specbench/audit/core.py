"""`run_audit`: draw continuations from a decoder, compare them with the target's p, decide.

The reference is the enumerated p (exact mode) or plain target sampling (sample mode); the
tests per prompt are the joint distribution, every position's marginal and the next token
after the most common prefixes, Holm-corrected together (see the package docstring).
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
from transformers import PreTrainedModel

from specbench.audit.decoders import DecoderUnderTest, autoregressive_decoder
from specbench.audit.exact import exact_distribution
from specbench.audit.result import SUMMARY_COLUMNS, AuditResult
from specbench.audit.settings import PAD, AuditSettings, derive_seed
from specbench.audit.stats import detectable_tv, gof_test, holm, two_sample_test
from specbench.decoding.sampling import SamplingConfig


class TooFewSamplesError(ValueError):
    """The samples cannot fill two bins of a joint test: the audit would have tested nothing joint."""


def _codes(rows: np.ndarray) -> np.ndarray:
    """One integer per distinct row (consistent across everything stacked into `rows`)."""
    return np.unique(rows, axis=0, return_inverse=True)[1].reshape(-1)


def _views(stacked: np.ndarray, weights_for_prefix: np.ndarray, tokens: int, top_prefixes: int) -> list:
    """(name, mask, codes) for every test: joint, marginals, next token given common prefixes.

    `weights_for_prefix` ranks prefixes (exact probabilities, or pooled counts); it must not
    depend on which side a sample came from.
    """
    views = [(f"joint[1..{tokens}]", np.ones(len(stacked), dtype=bool), _codes(stacked))]
    for k in range(tokens):
        views.append((f"marginal[{k + 1}]", np.ones(len(stacked), dtype=bool), stacked[:, k] + 1))
    if top_prefixes:
        for k in range(1, tokens):
            prefix_codes = _codes(stacked[:, :k])
            alive = stacked[:, k] != PAD  # the prefix did not end (EOS) before position k + 1
            totals = np.bincount(
                prefix_codes[alive], weights=weights_for_prefix[alive], minlength=prefix_codes.max() + 1
            )
            for code in np.argsort(-totals, kind="stable")[:top_prefixes]:
                if totals[code] <= 0:
                    break
                mask = alive & (prefix_codes == code)
                prefix = stacked[np.argmax(mask), :k].tolist()
                views.append((f"next[{k + 1}] after {','.join(map(str, prefix))}", mask, stacked[:, k] + 1))
    return views


def _compare(decoder: np.ndarray, reference, settings: AuditSettings, rng: np.random.Generator) -> list[tuple]:
    """All tests for one prompt. `reference` is ("exact", outcomes, probs) or ("sample", rows)."""
    n_dec = len(decoder)
    if reference[0] == "exact":
        _, outcomes, probs = reference
        stacked = np.concatenate([decoder, outcomes])
        rank = np.concatenate([np.zeros(n_dec), probs])
    else:
        stacked = np.concatenate([decoder, reference[1]])
        rank = np.ones(len(stacked))
    side = np.arange(len(stacked)) < n_dec
    results = []
    for name, mask, codes in _views(stacked, rank, settings.tokens, settings.top_prefixes):
        size = codes.max() + 1
        obs = np.bincount(codes[mask & side], minlength=size).astype(float)
        if reference[0] == "exact":
            ref_p = np.bincount(codes[mask & ~side], weights=probs[mask[n_dec:]], minlength=size)
            if ref_p.sum() <= 0:
                continue
            res = gof_test(obs, ref_p / ref_p.sum(), settings, rng)
        else:
            ref = np.bincount(codes[mask & ~side], minlength=size).astype(float)
            res = two_sample_test(obs, ref, settings, rng)
        if res is not None:
            results.append((name, res))
    return results


def _varies(reference) -> bool:
    """Has the reference more than one continuation? (Else no test can vary: the audit is trivially right.)"""
    if reference[0] == "exact":
        return int(np.sum(reference[2] > 0)) > 1
    return len(np.unique(reference[1], axis=0)) > 1


def _reference_mode(target_model: PreTrainedModel, sampling: SamplingConfig, settings: AuditSettings) -> str:
    """'exact' when every continuation can be enumerated (an upper bound on their number), else 'sample'."""
    if settings.reference != "auto":
        return settings.reference
    vocab = target_model.config.vocab_size
    branching = min(vocab, sampling.top_k) if sampling.top_k else vocab
    if sampling.greedy:
        branching = 1
    return "exact" if branching**settings.tokens <= settings.max_enumerate else "sample"


def run_audit(
    target_model: PreTrainedModel,
    decoder: DecoderUnderTest,
    prompts: list[list[int]],
    sampling: SamplingConfig,
    eos_token_ids: set[int] = frozenset(),
    settings: AuditSettings | None = None,
    reference: DecoderUnderTest | None = None,
    cache: dict | None = None,
) -> AuditResult:
    """Audit one decoder at one sampling config on these prompts; see the module docstring.

    `reference` (sample mode) defaults to `autoregressive_decoder(target_model, ...)`;
    `cache` (any dict) keeps enumerated distributions and reference samples between calls
    that share the target, prompts and sampling config.
    """
    settings = settings or AuditSettings()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("audit prompts: need at least one prompt, each with at least one token")
    cache = {} if cache is None else cache
    mode = _reference_mode(target_model, sampling, settings)
    n_ref = settings.reference_samples or settings.samples
    notes = []
    if decoder.gamma is not None and decoder.first_speculative_token + decoder.gamma > settings.tokens:
        notes.append(
            f"{decoder.name}: tokens={settings.tokens} < {decoder.first_speculative_token + decoder.gamma} "
            f"(first drafted position + gamma): a full round's bonus token falls outside the audited window"
        )
    started = time.perf_counter()
    rows = []
    for i, prompt in enumerate(prompts):
        key = (
            id(target_model),
            tuple(prompt),
            sampling,
            settings.tokens,
            tuple(sorted(eos_token_ids)),
            mode,
            (n_ref, settings.seed, reference and reference.name) if mode == "sample" else None,
        )
        if key not in cache:
            if mode == "exact":
                outcomes, probs = exact_distribution(
                    target_model, prompt, sampling, settings.tokens, eos_token_ids, settings.max_enumerate
                )
                cache[key] = ("exact", outcomes, probs)
            else:
                ref = reference or autoregressive_decoder(target_model, sampling, eos_token_ids, settings.batch_size)
                cache[key] = ("sample", ref.sample(prompt, n_ref, settings.tokens, derive_seed(settings.seed, 2, i)))
        samples = decoder.sample(prompt, settings.samples, settings.tokens, derive_seed(settings.seed, 1, i))
        rng = np.random.default_rng(derive_seed(settings.seed, 3, i))
        compared = _compare(samples, cache[key], settings, rng)
        if not any(name.startswith("joint") for name, _ in compared) and _varies(cache[key]):
            raise TooFewSamplesError(
                f"audit.samples={settings.samples}: too few continuations for the joint test of prompt {i} at "
                f"tokens={settings.tokens} (after pooling to expected counts >= {settings.min_expected:g} one bin is "
                "left, so the verdict and the TV would be meaningless); use more samples or fewer tokens"
            )
        for name, res in compared:
            rows.append(dict(prompt=i, test=name, **res))
    seconds = time.perf_counter() - started
    tests = pd.DataFrame(rows)
    sampling_name = sampling.describe()
    if tests.empty:
        notes.append(f"{decoder.name} at {sampling_name}: no testable variation (every continuation identical)")
        tests = pd.DataFrame(
            columns=[
                "prompt",
                "test",
                "kind",
                "n",
                "n_ref",
                "bins",
                "statistic",
                "p_value",
                "tv",
                "tv_lo",
                "tv_hi",
                "tv_plugin",
                "tv_null",
                "n_eff",
            ]
        )
    m = len(tests)
    tests["p_adjusted"] = holm(tests["p_value"].to_numpy(dtype=float)) if m else []
    level = settings.alpha / max(m, 1)
    tests["detectable_tv"] = [
        detectable_tv(int(b) - 1, float(ne), level, settings.power) if b >= 2 else np.nan
        for b, ne in zip(tests["bins"], tests["n_eff"])
    ]
    tests.insert(0, "sampling", sampling_name)
    tests.insert(0, "decoder", decoder.name)
    joint = tests[tests["test"].str.startswith("joint")]
    worst_joint = joint.loc[joint["tv"].idxmax()] if len(joint) else None
    p_min = float(tests["p_adjusted"].min()) if m else 1.0
    summary = pd.DataFrame(
        [
            dict(
                decoder=decoder.name,
                sampling=sampling_name,
                gamma=decoder.gamma,
                reference=mode if mode == "exact" else f"sample ({n_ref})",
                prompts=len(prompts),
                tokens=settings.tokens,
                samples=settings.samples,
                reference_samples=n_ref if mode == "sample" else None,
                tests=m,
                p_value=p_min,
                worst_test=(
                    f"prompt {tests.loc[tests['p_adjusted'].idxmin(), 'prompt']}: "
                    f"{tests.loc[tests['p_adjusted'].idxmin(), 'test']}"
                )
                if m
                else "",
                tv=float(worst_joint["tv"]) if worst_joint is not None else np.nan,
                tv_lo=float(worst_joint["tv_lo"]) if worst_joint is not None else np.nan,
                tv_hi=float(worst_joint["tv_hi"]) if worst_joint is not None else np.nan,
                tv_null=float(worst_joint["tv_null"]) if worst_joint is not None else np.nan,
                detectable_tv=float(joint["detectable_tv"].max()) if len(joint) else np.nan,
                verdict="pass" if p_min >= settings.alpha else "FAIL",
                seconds=round(seconds, 2),
            )
        ],
        columns=SUMMARY_COLUMNS,
    )
    return AuditResult(summary, tests, settings, notes)

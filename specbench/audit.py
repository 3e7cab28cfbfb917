"""Lossless audit: test, statistically, that a decoder preserves the target's distribution.

Speculative sampling is lossless only if every detail of the algorithm is right; a wrong
residual, a q that is not the distribution the drafts were sampled from, or a bonus token
taken from the wrong position all still produce fluent text. The audit draws many
continuations of `tokens` (n >= 3) tokens from the decoder under test and compares them
with the target's own distribution p (processed by the same `process_logits`):

* **exact mode** (small vocabularies): the target's distribution of the first n tokens is
  enumerated (every continuation with p > 0, at most `max_enumerate`), and the decoder's
  frequencies are tested against it with Pearson's chi-square goodness of fit
  (`scipy.stats.chisquare`); an outcome of probability 0 that is observed fails outright;
* **sample mode** (any model): plain target sampling (`autoregressive_decode`, same
  processing) is the reference, and each comparison is a G-test on the 2 x K table
  (`chi2_contingency(..., lambda_="log-likelihood", correction=False)`).

Tests, per prompt: the joint distribution of the n tokens; the marginal of every position;
and the next-token distribution at positions 2..n given each of the `top_prefixes` most
common prefixes (most probable under p in exact mode, most frequent in the pooled samples
in sample mode; both choices are blind to which side a sample came from). Outcomes are
pooled into an "other" bin until every expected count is >= `min_expected` (5).

Multiple testing: all tests of one audit (every prompt) form one family, corrected with
Holm's step-down method, which controls the family-wise error rate at `alpha` (0.01) under
any dependence between the tests; the audit FAILs when any Holm-adjusted p-value is below
alpha. The reported p-value is the smallest Holm-adjusted one.

Effect size: the total-variation distance between the two distributions on the test's
bins. The plug-in estimate (`tv_plugin`) is biased upward by sampling noise, so `tv` is the
bootstrap bias-corrected estimate (2 plugin - mean of the bootstrap replicates; multinomial
resampling) with the basic bootstrap interval [2 plugin - q_hi, 2 plugin - q_lo]; `tv_null`
is the mean plug-in TV when there is no difference at all (the noise floor at this sample
size). Near 0 a TV estimate is dominated by noise: decide with the p-value, and read the
audit's strength from `detectable_tv`.

Power: `detectable_tv` is the smallest TV on a test's bins that the test detects with
probability `power` (0.8) at the Bonferroni level alpha/m (the strictest step of Holm),
whatever the shape of the deviation. The chi-square and G statistics are asymptotically
noncentral chi-square with df = bins - 1 and noncentrality lambda = n_eff * sum(d^2/pi)
(n_eff = n for exact mode, n_a n_b / (n_a + n_b) for two samples); by Cauchy-Schwarz
sum(d^2/pi) >= (sum|d|)^2 = 4 TV^2, so TV >= sqrt(lambda*/(4 n_eff)) guarantees the power,
where lambda* solves P(ncx2(df, lambda*) > chi2.isf(alpha/m, df)) = power. Deviations
concentrated on a few outcomes (the usual bug) are detected well below that bound.

Efficiency: continuations are drawn in batches of copies of one prompt with one
`torch.Generator` per batch; the B identical prompts are prefilled once and the row is
copied (`SharedPrefillLM`: the same cache the per-row prefill builds, 1 forward instead of B).

Calibration (scripts/audit_false_alarms.py, default settings, tiny pair, T=1 top-k=5): the
correct speculative decoder FAILed 10 of 1000 seeds (1.0%); continuations drawn straight
from the enumerated p FAILed 28 of 3000 audits in exact mode and 9 of 1000 in sample mode.

`run_audit(...) -> AuditResult` is the core; `python -m specbench.audit` is the CLI
(writes audit.md and audit.csv, exits 1 when any audit fails).
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import optimize, stats
from transformers import PreTrainedModel

from specbench.decoding.acceptance import rejection_sample
from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.drafts import ModelDraft
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.sampling import SamplingConfig, process_logits

PAD = -1  # token slot after EOS ended a continuation
REFERENCES = ("auto", "exact", "sample")
DECODER_CHOICES = "specbench | autoregressive | hf_assisted | broken:<variant>"


# --------------------------------------------------------------------------- settings


@dataclass
class AuditSettings:
    """Sample sizes and test settings; the defaults are the ones the broken variants are tested at."""

    samples: int = 4096  # continuations per prompt from the decoder under test
    tokens: int = 4  # n: tokens per continuation (>= 3; >= gamma + 2 puts a whole round in the window)
    alpha: float = 0.01  # family-wise error rate (Holm over every test of the audit)
    power: float = 0.8  # for detectable_tv
    reference: str = "auto"  # exact | sample | auto (exact when the enumeration fits)
    reference_samples: int | None = None  # sample mode: reference continuations per prompt (None: = samples)
    max_enumerate: int = 65536  # exact mode: most continuations enumerated per prompt
    top_prefixes: int = 3  # conditional tests per position
    min_expected: float = 5.0  # pool bins until every expected count reaches this
    bootstrap: int = 1000  # bootstrap resamples for the TV CI
    ci: float = 0.95
    batch_size: int = 1024  # copies of a prompt per decoder call
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in (("samples", 20), ("tokens", 3), ("max_enumerate", 1), ("top_prefixes", 0),
                          ("bootstrap", 0), ("batch_size", 1)):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"audit.{name}={value!r}: must be an integer >= {low}")
        if self.reference_samples is not None and (not isinstance(self.reference_samples, int)
                                                   or self.reference_samples < 20):  # fmt: skip
            raise ValueError(f"audit.reference_samples={self.reference_samples!r}: must be None or an integer >= 20")
        if self.reference not in REFERENCES:
            raise ValueError(f"audit.reference={self.reference!r}: must be one of {list(REFERENCES)}")
        for name in ("alpha", "power", "ci"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise ValueError(f"audit.{name}={value!r}: must be in (0, 1)")
        if not self.min_expected > 0:
            raise ValueError(f"audit.min_expected={self.min_expected!r}: must be > 0")


# --------------------------------------------------------------------------- decoders


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from a tuple of non-negative ints (independent streams per role/prompt/batch)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(2, np.uint64)[0] >> np.uint64(1))


class SharedPrefillLM(CachedLM):
    """CachedLM that prefills a batch of identical prompts once and copies the row.

    The audit's batches are B copies of one prompt. `CachedLM.prefill` runs one forward
    per row, and for identical rows these give identical caches, so prefilling one row and
    replicating it with `select_rows` builds the very same state with 1 forward instead of
    B. Anything else takes the per-row path unchanged.
    """

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        if len(prompts) > 1 and all(p == prompts[0] for p in prompts):
            logits = super().prefill([prompts[0]])
            self.select_rows([0] * len(prompts))  # a gather: B copies of row 0
            return logits.repeat(len(prompts), 1)
        return super().prefill(prompts)


def _pad(rows: list[list[int]], tokens: int) -> np.ndarray:
    out = np.full((len(rows), tokens), PAD, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row[:tokens]
    return out


@dataclass
class DecoderUnderTest:
    """A named sampler: (prompt, n continuations, tokens, seed) -> int64 array [n, tokens], PAD after EOS."""

    name: str
    sample: Callable[[list[int], int, int, int], np.ndarray]
    gamma: int | None = None
    first_speculative_token: int = 2  # 1-based position of the first token a draft can produce


def _batched(run: Callable[[list[list[int]], int, torch.Generator], list[list[int]]], batch_size: int):
    def sample(prompt: list[int], n: int, tokens: int, seed: int) -> np.ndarray:
        out, done, b = [], 0, 0
        while done < n:
            size = min(batch_size, n - done)
            generator = torch.Generator().manual_seed(derive_seed(seed, b))
            out.append(_pad(run([list(prompt)] * size, tokens, generator), tokens))
            done, b = done + size, b + 1
        return np.concatenate(out)

    return sample


def specbench_decoder(
    target_model: PreTrainedModel,
    draft_model: PreTrainedModel,
    gamma: int,
    sampling: SamplingConfig,
    eos_token_ids: set[int] = frozenset(),
    batch_size: int = 1024,
    variant: str | None = None,
    batched_prefill: bool = True,
) -> DecoderUnderTest:
    """specbench's `speculative_decode` with a model draft, or one of its broken variants."""
    from specbench.audit_variants import get_variant

    v = get_variant(variant) if variant else None
    lm_class = SharedPrefillLM if batched_prefill else CachedLM

    def run(prompts, tokens, generator):
        draft = v.new_draft(draft_model) if v else ModelDraft(draft_model, name="draft")
        draft.lm = lm_class(draft_model)
        result = speculative_decode(lm_class(target_model), draft, prompts, gamma, sampling, tokens,
                                    set(eos_token_ids), generator, rule=v.rule if v else rejection_sample)  # fmt: skip
        return result.tokens

    name = f"broken:{variant}" if variant else "specbench"
    return DecoderUnderTest(name, _batched(run, batch_size), gamma, first_speculative_token=2)


def autoregressive_decoder(
    target_model: PreTrainedModel,
    sampling: SamplingConfig,
    eos_token_ids: set[int] = frozenset(),
    batch_size: int = 1024,
    batched_prefill: bool = True,
) -> DecoderUnderTest:
    """Plain target sampling: the sample-mode reference (and a decoder that must pass)."""
    lm_class = SharedPrefillLM if batched_prefill else CachedLM

    def run(prompts, tokens, generator):
        return autoregressive_decode(lm_class(target_model), prompts, sampling, tokens, set(eos_token_ids),
                                     generator).tokens  # fmt: skip

    return DecoderUnderTest("autoregressive", _batched(run, batch_size), None, first_speculative_token=0)


def hf_assisted_decoder(
    target_model: PreTrainedModel,
    draft_model: PreTrainedModel,
    gamma: int,
    sampling: SamplingConfig,
    eos_token_ids: set[int] = frozenset(),
) -> DecoderUnderTest:
    """transformers' assisted generation, one continuation per `generate` call (batch size 1)."""
    from specbench.decoding.hf_assisted import hf_assisted_decode
    from specbench.decoding.timing import PhaseTimer

    def sample(prompt, n, tokens, seed):
        timer = PhaseTimer(target_model.device)
        rows = []
        for i in range(n):
            timer.reset()
            result = hf_assisted_decode(target_model, draft_model, [list(prompt)], gamma, sampling, tokens,
                                        set(eos_token_ids), derive_seed(seed, i), timer)  # fmt: skip
            rows.append(result.tokens[0])
        return _pad(rows, tokens)

    return DecoderUnderTest("hf_assisted", sample, gamma, first_speculative_token=1)


# --------------------------------------------------------------------------- exact distribution


@torch.inference_mode()
def exact_distribution(
    target_model: PreTrainedModel,
    prompt: list[int],
    sampling: SamplingConfig,
    tokens: int,
    eos_token_ids: set[int] = frozenset(),
    max_outcomes: int = 65536,
    chunk: int = 1024,
) -> tuple[np.ndarray, np.ndarray]:
    """Every continuation of `tokens` tokens with p > 0 and its probability under the target.

    Returns outcomes [K, tokens] int64 (PAD after an EOS) and probabilities [K] float64 that
    sum to 1: the product of the target's processed next-token probabilities
    (`process_logits`), expanded level by level with full forwards (no cache).
    """
    device = target_model.device
    eos = set(eos_token_ids)
    live = np.zeros((1, 0), dtype=np.int64)
    live_p = np.ones(1)
    done, done_p = [], []
    for pos in range(tokens):
        probs = []
        for start in range(0, len(live), chunk):
            rows = live[start : start + chunk]
            x = torch.tensor(np.concatenate([np.tile(prompt, (len(rows), 1)), rows], 1), device=device)
            p = process_logits(target_model(input_ids=x).logits[:, -1], sampling).double().cpu().numpy()
            probs.append(p / p.sum(-1, keepdims=True))
        joint = live_p[:, None] * np.concatenate(probs)  # [M, V]
        row, tok = np.nonzero(joint > 0)
        count = len(row) + sum(len(d) for d in done)
        if count > max_outcomes:
            raise ValueError(
                f"exact audit: {count} continuations of up to {pos + 1} tokens have p > 0, more than "
                f"max_enumerate={max_outcomes}; use reference='sample' or fewer tokens"
            )
        seqs = np.concatenate([live[row], tok[:, None]], 1)
        seq_p = joint[row, tok]
        ended = np.isin(tok, list(eos)) if eos else np.zeros(len(tok), dtype=bool)
        if ended.any():
            pad = np.full((int(ended.sum()), tokens - pos - 1), PAD, dtype=np.int64)
            done.append(np.concatenate([seqs[ended], pad], 1))
            done_p.append(seq_p[ended])
        live, live_p = seqs[~ended], seq_p[~ended]
    outcomes = np.concatenate(done + [live]) if done else live
    p = np.concatenate(done_p + [live_p]) if done_p else live_p
    return outcomes, p / p.sum()


# --------------------------------------------------------------------------- tests


def _pool_gof(obs: np.ndarray, prob: np.ndarray, n: int, min_expected: float) -> tuple[np.ndarray, np.ndarray]:
    """Bins for a goodness-of-fit test: categories in decreasing p, the tail pooled into 'other'."""
    order = np.argsort(-prob, kind="stable")
    obs, prob = obs[order], prob[order]
    keep = int(np.sum(n * prob >= min_expected))
    while keep > 0 and keep < len(prob) and n * prob[keep:].sum() < min_expected:
        keep -= 1
    bins_o = list(obs[:keep]) + ([obs[keep:].sum()] if keep < len(prob) else [])
    bins_p = list(prob[:keep]) + ([prob[keep:].sum()] if keep < len(prob) else [])
    return np.asarray(bins_o, dtype=float), np.asarray(bins_p, dtype=float)


def _pool_two_sample(a: np.ndarray, b: np.ndarray, min_expected: float) -> tuple[np.ndarray, np.ndarray]:
    """Bins for a 2 x K table: categories in decreasing pooled count, the tail pooled into 'other'."""
    pooled = a + b
    order = np.argsort(-pooled, kind="stable")
    a, b, pooled = a[order], b[order], pooled[order]
    scale = min(a.sum(), b.sum()) / pooled.sum()  # the smaller row's expected count per pooled count
    keep = int(np.sum(pooled * scale >= min_expected))
    while keep > 0 and keep < len(pooled) and pooled[keep:].sum() * scale < min_expected:
        keep -= 1
    tail = keep < len(pooled)
    return (np.asarray(list(a[:keep]) + ([a[keep:].sum()] if tail else []), dtype=float),
            np.asarray(list(b[:keep]) + ([b[keep:].sum()] if tail else []), dtype=float))  # fmt: skip


def _tv_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return 0.5 * np.abs(x - y).sum(-1)


def _tv_estimate(plugin: float, boot: np.ndarray, ci: float) -> tuple[float, float, float]:
    """Bias-corrected TV and its basic (reverse-percentile) bootstrap interval, clipped to [0, 1].

    The plug-in TV is biased upward (sampling noise adds |d| in every bin); the bootstrap
    estimates that bias as mean(boot) - plugin, and the basic interval
    [2 plugin - q_hi, 2 plugin - q_lo] is centred on the corrected estimate.
    """
    if len(boot) == 0:
        return plugin, float("nan"), float("nan")
    q_lo, q_hi = np.quantile(boot, [(1 - ci) / 2, (1 + ci) / 2])
    clip = lambda v: float(min(1.0, max(0.0, v)))  # noqa: E731
    return clip(2 * plugin - boot.mean()), clip(2 * plugin - q_hi), clip(2 * plugin - q_lo)


def gof_test(obs: np.ndarray, prob: np.ndarray, settings: AuditSettings, rng: np.random.Generator) -> dict | None:
    """Chi-square goodness of fit of counts `obs` against probabilities `prob` (same categories).

    Observed outcomes of probability 0 make it a failed "support" test (p-value 0): the
    target can never produce them. They enter the TV as one extra bin of probability 0.
    """
    n = int(obs.sum())
    if n == 0:
        return None
    impossible = float(obs[prob <= 0].sum())
    o, p = _pool_gof(obs[prob > 0], prob[prob > 0], n, settings.min_expected)
    if len(o) < 2 and not impossible:
        return None
    p = p / p.sum()
    if impossible:
        kind, statistic, p_value = "support", float("inf"), 0.0
        o, p = np.append(o, impossible), np.append(p, 0.0)
    else:
        kind = "gof"
        statistic, p_value = stats.chisquare(o, p * n)
    phat = o / n
    plugin = float(_tv_rows(phat, p))
    boot = _tv_rows(rng.multinomial(n, phat, size=settings.bootstrap) / n, p) if settings.bootstrap else np.zeros(0)
    null = rng.multinomial(n, p, size=max(settings.bootstrap, 200)) / n
    tv, lo, hi = _tv_estimate(plugin, boot, settings.ci)
    return dict(kind=kind, n=n, n_ref=None, bins=len(o), statistic=float(statistic), p_value=float(p_value),
                tv=tv, tv_lo=lo, tv_hi=hi, tv_plugin=plugin, tv_null=float(_tv_rows(null, p).mean()),
                n_eff=float(n))  # fmt: skip


def two_sample_test(a: np.ndarray, b: np.ndarray, settings: AuditSettings, rng: np.random.Generator) -> dict | None:
    """G-test on the 2 x K table of decoder counts `a` and reference counts `b` (same categories)."""
    na, nb = int(a.sum()), int(b.sum())
    if na == 0 or nb == 0:
        return None
    x, y = _pool_two_sample(a, b, settings.min_expected)
    if len(x) < 2:
        return None
    statistic, p_value, _, _ = stats.chi2_contingency(np.stack([x, y]), correction=False, lambda_="log-likelihood")
    pa, pb = x / na, y / nb
    plugin = float(_tv_rows(pa, pb))
    r = settings.bootstrap
    boot = (_tv_rows(rng.multinomial(na, pa, size=r) / na, rng.multinomial(nb, pb, size=r) / nb) if r
            else np.zeros(0))  # fmt: skip
    pooled = (x + y) / (na + nb)
    rn = max(r, 200)
    tv_null = _tv_rows(rng.multinomial(na, pooled, size=rn) / na, rng.multinomial(nb, pooled, size=rn) / nb).mean()
    tv, lo, hi = _tv_estimate(plugin, boot, settings.ci)
    return dict(kind="g-test", n=na, n_ref=nb, bins=len(x), statistic=float(statistic), p_value=float(p_value),
                tv=tv, tv_lo=lo, tv_hi=hi, tv_plugin=plugin, tv_null=float(tv_null),
                n_eff=na * nb / (na + nb))  # fmt: skip


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values (family-wise error control under any dependence)."""
    p = np.asarray(p_values, dtype=float)
    m = len(p)
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adjusted
    return out


def noncentrality_for_power(df: int, level: float, power: float) -> float:
    """lambda such that a chi-square test with df degrees of freedom at `level` has this power."""
    crit = stats.chi2.isf(level, df)
    f = lambda lam: stats.ncx2.sf(crit, df, lam) - power  # noqa: E731
    hi = 10.0
    while f(hi) < 0:
        hi *= 2
    return float(optimize.brentq(f, 1e-9, hi, xtol=1e-6))


def detectable_tv(df: int, n_eff: float, level: float, power: float) -> float:
    """Smallest TV (on the test's bins) detected with `power` at `level`, for any deviation shape."""
    return float(np.sqrt(noncentrality_for_power(df, level, power) / (4.0 * n_eff)))


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
            totals = np.bincount(prefix_codes[alive], weights=weights_for_prefix[alive],
                                 minlength=prefix_codes.max() + 1)  # fmt: skip
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


# --------------------------------------------------------------------------- the audit


def describe_sampling(s: SamplingConfig) -> str:
    if s.greedy:
        return "greedy"
    parts = [f"T={s.temperature:g}"]
    if s.top_k:
        parts.append(f"top_k={s.top_k}")
    if s.top_p < 1:
        parts.append(f"top_p={s.top_p:g}")
    return " ".join(parts)


SUMMARY_COLUMNS = ["decoder", "sampling", "gamma", "reference", "prompts", "tokens", "samples", "reference_samples",
                   "tests", "p_value", "worst_test", "tv", "tv_lo", "tv_hi", "tv_null", "detectable_tv", "verdict",
                   "seconds"]  # fmt: skip


@dataclass
class AuditResult:
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
        table["tv (95% CI)"] = [f"{t:.3f} [{lo:.3f}, {hi:.3f}]" for t, lo, hi in
                                zip(table["tv"], table["tv_lo"], table["tv_hi"])]  # fmt: skip
        for col in ("tv_null", "detectable_tv"):
            table[col] = table[col].map(lambda v: f"{v:.3f}")
        table["verdict"] = table["verdict"].map(lambda v: "pass" if v == "pass" else "**FAIL**")
        cols = ["decoder", "sampling", "gamma", "reference", "samples", "tests", "p_value", "tv (95% CI)",
                "tv_null", "detectable_tv", "verdict"]  # fmt: skip
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
        lines += ["", "## Most significant tests of each audit", "",
                  _markdown_table(worst[["decoder", "sampling", "prompt", "test", "kind", "n", "bins", "p_value",
                                         "p_adjusted", "tv", "tv_null", "detectable_tv"]])]  # fmt: skip
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


def _reference_mode(target_model: PreTrainedModel, sampling: SamplingConfig, settings: AuditSettings) -> str:
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
    import time

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
        key = (id(target_model), tuple(prompt), sampling, settings.tokens, tuple(sorted(eos_token_ids)), mode,
               (n_ref, settings.seed, reference and reference.name) if mode == "sample" else None)  # fmt: skip
        if key not in cache:
            if mode == "exact":
                outcomes, probs = exact_distribution(target_model, prompt, sampling, settings.tokens, eos_token_ids,
                                                     settings.max_enumerate)  # fmt: skip
                cache[key] = ("exact", outcomes, probs)
            else:
                ref = reference or autoregressive_decoder(target_model, sampling, eos_token_ids, settings.batch_size)
                cache[key] = ("sample", ref.sample(prompt, n_ref, settings.tokens, derive_seed(settings.seed, 2, i)))
        samples = decoder.sample(prompt, settings.samples, settings.tokens, derive_seed(settings.seed, 1, i))
        rng = np.random.default_rng(derive_seed(settings.seed, 3, i))
        for name, res in _compare(samples, cache[key], settings, rng):
            rows.append(dict(prompt=i, test=name, **res))
    seconds = time.perf_counter() - started
    tests = pd.DataFrame(rows)
    sampling_name = describe_sampling(sampling)
    if tests.empty:
        notes.append(f"{decoder.name} at {sampling_name}: no testable variation (every continuation identical)")
        tests = pd.DataFrame(columns=["prompt", "test", "kind", "n", "n_ref", "bins", "statistic", "p_value", "tv",
                                      "tv_lo", "tv_hi", "tv_plugin", "tv_null", "n_eff"])  # fmt: skip
    m = len(tests)
    tests["p_adjusted"] = holm(tests["p_value"].to_numpy(dtype=float)) if m else []
    level = settings.alpha / max(m, 1)
    tests["detectable_tv"] = [detectable_tv(int(b) - 1, float(ne), level, settings.power) if b >= 2 else np.nan
                              for b, ne in zip(tests["bins"], tests["n_eff"])]  # fmt: skip
    tests.insert(0, "sampling", sampling_name)
    tests.insert(0, "decoder", decoder.name)
    joint = tests[tests["test"].str.startswith("joint")]
    worst_joint = joint.loc[joint["tv"].idxmax()] if len(joint) else None
    p_min = float(tests["p_adjusted"].min()) if m else 1.0
    summary = pd.DataFrame([dict(
        decoder=decoder.name, sampling=sampling_name, gamma=decoder.gamma, reference=mode if mode == "exact" else
        f"sample ({n_ref})", prompts=len(prompts), tokens=settings.tokens, samples=settings.samples,
        reference_samples=n_ref if mode == "sample" else None, tests=m, p_value=p_min,
        worst_test=(f"prompt {tests.loc[tests['p_adjusted'].idxmin(), 'prompt']}: "
                    f"{tests.loc[tests['p_adjusted'].idxmin(), 'test']}") if m else "",
        tv=float(worst_joint["tv"]) if worst_joint is not None else np.nan,
        tv_lo=float(worst_joint["tv_lo"]) if worst_joint is not None else np.nan,
        tv_hi=float(worst_joint["tv_hi"]) if worst_joint is not None else np.nan,
        tv_null=float(worst_joint["tv_null"]) if worst_joint is not None else np.nan,
        detectable_tv=float(joint["detectable_tv"].max()) if len(joint) else np.nan,
        verdict="pass" if p_min >= settings.alpha else "FAIL", seconds=round(seconds, 2),
    )], columns=SUMMARY_COLUMNS)  # fmt: skip
    return AuditResult(summary, tests, settings, notes)


# --------------------------------------------------------------------------- pairs and CLI

TINY_PROMPTS = [[3, 7, 11], [5, 2, 9, 14]]
EMBEDDED_PROMPTS = ["The capital of France is", "My favourite colour is"]


def tiny_pair(
    vocab_size: int = 16, init_std: float = 0.3, draft_noise: float = 0.1, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedModel]:
    """A float64 toy target (random tiny Llama, vocab 16) and a draft = target with perturbed weights.

    init_std 0.3 (not 0.02) makes p far from uniform and strongly dependent on the last
    token; weight noise of 0.1 x each matrix's std gives an acceptance rate of about 0.7
    at T=1 (0.65-0.75 with top-k 5), so every broken variant changes the output noticeably.
    """
    from specbench.models.shapes import build_shape_only_model, shape_config

    config = shape_config("tiny-llama", vocab_size=vocab_size, initializer_range=init_std, hidden_size=32,
                          intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    target = build_shape_only_model(config, dtype=torch.float64, seed=seed)
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in draft.parameters():
            if param.dim() >= 2:
                param.add_(torch.randn(param.shape, generator=g, dtype=param.dtype) * draft_noise * param.std())
    return target, draft


def load_audit_pair(name: str) -> tuple[PreTrainedModel, PreTrainedModel, list[list[int]], set[int]]:
    """(target, draft, prompts, eos ids) for `--pair tiny|embedded`."""
    if name == "tiny":
        target, draft = tiny_pair()
        return target, draft, [list(p) for p in TINY_PROMPTS], set()
    if name == "embedded":
        from specbench.models.loading import eos_ids, load_model
        from specbench.models.quant import quantize_w8a16

        target, tokenizer = load_model("embedded", dtype="float32")
        prompts = [tokenizer(t)["input_ids"] for t in EMBEDDED_PROMPTS]
        return target, quantize_w8a16(target), prompts, eos_ids(tokenizer, target)
    raise ValueError(f"audit.pair={name!r}: must be one of ['tiny', 'embedded']")


def check_decoder_name(name: str) -> None:
    from specbench.audit_variants import get_variant

    if name.startswith("broken:"):
        get_variant(name.removeprefix("broken:"))
    elif name not in ("specbench", "autoregressive", "hf_assisted"):
        raise ValueError(f"audit.decoder={name!r}: must be {DECODER_CHOICES}")


def make_decoder(
    name: str, target, draft, gamma: int, sampling: SamplingConfig, eos: set[int], settings: AuditSettings
) -> DecoderUnderTest:
    if name == "specbench":
        return specbench_decoder(target, draft, gamma, sampling, eos, settings.batch_size)
    if name == "autoregressive":
        return autoregressive_decoder(target, sampling, eos, settings.batch_size)
    if name == "hf_assisted":
        return hf_assisted_decoder(target, draft, gamma, sampling, eos)
    if name.startswith("broken:"):
        return specbench_decoder(target, draft, gamma, sampling, eos, settings.batch_size,
                                 variant=name.removeprefix("broken:"))  # fmt: skip
    raise ValueError(f"audit.decoder={name!r}: must be {DECODER_CHOICES}")


def _parse_sampling(text: str) -> SamplingConfig:
    parts = text.split(":")
    if not 1 <= len(parts) <= 3:
        raise argparse.ArgumentTypeError(f"--sampling {text!r}: expected T[:top_k[:top_p]], e.g. 1.0:50:1.0")
    try:
        return SamplingConfig(float(parts[0]), int(parts[1]) if len(parts) > 1 else 0,
                              float(parts[2]) if len(parts) > 2 else 1.0)  # fmt: skip
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--sampling {text!r}: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specbench.audit",
        description="Lossless audit: does a decoder preserve the target's output distribution? "
        "Exits 1 when any audit fails.",
    )
    parser.add_argument("--pair", default="tiny", choices=["tiny", "embedded"])
    parser.add_argument("--decoder", action="append", help=f"{DECODER_CHOICES}; repeat for several (default specbench)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--sampling", action="append", type=_parse_sampling, metavar="T[:K[:P]]",
                        help="extra sampling configs (repeatable), e.g. --sampling 1.0:50")  # fmt: skip
    parser.add_argument("--gamma", type=int, default=2)
    d = AuditSettings()
    parser.add_argument("--samples", type=int, default=d.samples, help="continuations per prompt (decoder)")
    parser.add_argument("--reference-samples", type=int, default=None, help="sample mode: reference continuations")
    parser.add_argument("--tokens", type=int, default=d.tokens)
    parser.add_argument("--reference", default=d.reference, choices=REFERENCES)
    parser.add_argument("--max-enumerate", type=int, default=d.max_enumerate)
    parser.add_argument("--prompts", type=int, default=None, help="use only the first N built-in prompts")
    parser.add_argument("--alpha", type=float, default=d.alpha)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--out", default="runs/audit")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        settings = AuditSettings(samples=args.samples, tokens=args.tokens, alpha=args.alpha, reference=args.reference,
                                 reference_samples=args.reference_samples, max_enumerate=args.max_enumerate,
                                 batch_size=args.batch_size, seed=args.seed)  # fmt: skip
        samplings = [SamplingConfig(args.temperature, args.top_k, args.top_p)] + (args.sampling or [])
        decoders = args.decoder or ["specbench"]
        for name in decoders:
            check_decoder_name(name)
        if args.gamma < 1:
            raise ValueError(f"--gamma={args.gamma}: must be >= 1")
    except ValueError as exc:
        parser.error(str(exc))
    target, draft, prompts, eos = load_audit_pair(args.pair)
    if args.prompts:
        prompts = prompts[: args.prompts]
    results, cache = [], {}
    for sampling in samplings:
        for name in decoders:
            decoder = make_decoder(name, target, draft, args.gamma, sampling, eos, settings)
            result = run_audit(target, decoder, prompts, sampling, eos, settings, cache=cache)
            row = result.summary.iloc[0]
            print(f"{row.decoder:>28} {row.sampling:<16} p={row.p_value:.3g} tv={row.tv:.3f} "
                  f"detectable_tv={row.detectable_tv:.3f} {row.verdict} ({row.seconds:.0f} s)", flush=True)  # fmt: skip
            results.append(result)
    result = AuditResult.concat(results)
    out = result.save(args.out)
    print(f"wrote {out / 'audit.md'} and {out / 'audit.csv'}: {'PASS' if result.passed else 'FAIL'}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())

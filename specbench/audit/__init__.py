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

Modules: `settings` (AuditSettings, seeds), `names` (the decoder names), `decoders` (decoders under test), `variants` (the
deliberately broken ones), `exact` (the enumerated reference), `stats` (tests, TV, power),
`core` (`run_audit(...) -> AuditResult`), `result` (tables), `pairs` (tiny / embedded) and
`cli` (`python -m specbench.audit`: writes audit.md and audit.csv, exits 1 when any audit fails).
"""

import importlib

# Exported lazily (PEP 562), so `python -m specbench.audit` parses its arguments before torch loads.
_EXPORTS = {
    "run_audit": "core",
    "DecoderUnderTest": "decoders",
    "SharedPrefillLM": "decoders",
    "autoregressive_decoder": "decoders",
    "hf_assisted_decoder": "decoders",
    "make_decoder": "decoders",
    "speculative_decoder": "decoders",
    "exact_distribution": "exact",
    "TINY_PROMPTS": "pairs",
    "load_audit_pair": "pairs",
    "tiny_pair": "pairs",
    "AuditResult": "result",
    "PAD": "settings",
    "AuditSettings": "settings",
    "derive_seed": "settings",
    "VARIANTS": "variants",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

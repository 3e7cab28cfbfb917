"""KV bytes on request rows, hand-computed on the tiny float64 Llama (2 layers, 2 KV heads, head_dim 8).

One cache column of it holds K and V: 2 × 2 layers × 2 heads × 8 dims × 8 bytes = 512 bytes.
"""

from __future__ import annotations

import math

from conftest import VOCAB, tiny_llama

from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.drafts import ModelDraft, NgramDraft
from specbench.decoding.hf_assisted import hf_assisted_decode
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.records import REQUEST_COLUMNS
from specbench.decoding.sampling import SamplingConfig
from specbench.decoding.timing import PhaseTimer

COLUMN = 2 * 2 * 2 * 8 * 8  # bytes per cache column of the tiny target
GREEDY = SamplingConfig()


def test_request_columns_carry_kv_bytes():
    assert {"kv_bytes_target", "kv_bytes_draft"} <= set(REQUEST_COLUMNS)


def test_autoregressive_rows_hold_the_padded_width(target, prompts):
    # Prompts of 6 and 11 tokens share one rectangular cache 11 wide; 5 new tokens feed 4 more
    # columns (the last token is never fed): both rows hold 15 columns, padding included.
    result = autoregressive_decode(CachedLM(target), [prompts[0], prompts[1]], GREEDY, 5, set())
    assert [r.kv_bytes_target for r in result.requests] == [15 * COLUMN, 15 * COLUMN]
    assert [r.kv_bytes_draft for r in result.requests] == [0, 0]


def test_speculative_rows_count_target_and_draft_columns(target, prompts):
    # Draft = the target itself, greedy: every draft is accepted. γ=2, prompt 6, 5 new tokens:
    # round 1 feeds [t1, d1, d2] to the target (9 columns) and commits 3 (4 new tokens);
    # round 2 feeds 3 more (12 columns), all accepted, but only 1 token fits: the row ends
    # holding 12 target columns. The draft caches all but its newest token: 6 prefill,
    # +2 (t1, d1) in round 1, +3 (d2, bonus, e1) in round 2 = 11 columns.
    result = speculative_decode(CachedLM(target), ModelDraft(target), [prompts[0]], 2, GREEDY, 5, set())
    (req,) = result.requests
    assert req.new_tokens == 5 and [r.accepted for r in result.rounds] == [2, 2]
    assert (req.kv_bytes_target, req.kv_bytes_draft) == (12 * COLUMN, 11 * COLUMN)


def test_draft_bytes_follow_the_draft_tensors(target, prompts):
    # A one-layer draft holds half the bytes per column; a model-free draft holds none.
    small = speculative_decode(CachedLM(target), ModelDraft(tiny_llama(5, layers=1)), [prompts[0]], 2, GREEDY, 6, set())
    (req,) = small.requests
    assert req.kv_bytes_draft > 0 and req.kv_bytes_draft % (COLUMN // 2) == 0
    assert req.kv_bytes_draft // (COLUMN // 2) >= len(prompts[0]) + req.new_tokens - 2
    ngram = speculative_decode(CachedLM(target), NgramDraft(VOCAB), prompts, 3, GREEDY, 8, set())
    assert all(r.kv_bytes_draft == 0 and r.kv_bytes_target % COLUMN == 0 for r in ngram.requests)


def test_hf_assisted_reports_the_target_cache_only(target, close_draft, prompts):
    result = hf_assisted_decode(target, close_draft, [prompts[0]], 2, GREEDY, 5, set(), 0, PhaseTimer())
    (req,) = result.requests
    # transformers crops its cache to the committed tokens: prompt + new − 1 columns at least.
    assert req.kv_bytes_target % COLUMN == 0
    assert len(prompts[0]) + req.new_tokens - 1 <= req.kv_bytes_target // COLUMN <= len(prompts[0]) + req.new_tokens + 2
    assert math.isnan(req.kv_bytes_draft)

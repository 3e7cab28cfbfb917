"""C_t(k): time one target forward over k new tokens, per batch size, measured directly.

Verification cost is flat in k while the forward is memory-bound and rises once it is
compute-bound, so the cost model fits a monotone curve to these points rather than
guessing C_t(γ+1) from a line. Each forward is rolled back, so the context stays fixed.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from specbench.decoding.kvcache import CachedLM
from specbench.decoding.timing import PhaseTimer

CT_COLUMNS = ["batch_size", "k", "context_len", "repeat", "t_forward"]


def bench_target_forward(
    target: PreTrainedModel,
    batch_size: int,
    ks: list[int] | range = range(1, 17),
    context_len: int = 128,
    repeats: int = 3,
    seed: int = 0,
) -> list[dict]:
    """Rows (batch_size, k, context_len, repeat, t_forward seconds) over a random context."""
    g = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    context = torch.randint(0, vocab, (batch_size, context_len), generator=g).tolist()
    lm = CachedLM(target)
    lm.prefill(context)
    timer = PhaseTimer(target.device)
    warm = torch.randint(0, vocab, (batch_size, 1), generator=g).to(target.device)
    lm.feed(warm)  # first forward pays one-off costs; not recorded
    lm.keep_last_fed(1, [0] * batch_size)
    marks = []
    for repeat in range(repeats):
        for k in ks:
            tokens = torch.randint(0, vocab, (batch_size, k), generator=g).to(target.device)
            start = timer.mark()
            lm.feed(tokens)
            end = timer.mark()
            lm.keep_last_fed(k, [0] * batch_size)  # roll back: the context stays fixed
            marks.append((repeat, k, start, end))
    seconds = timer.resolve()
    return [
        {
            "batch_size": batch_size,
            "k": k,
            "context_len": context_len,
            "repeat": r,
            "t_forward": seconds[e] - seconds[s],
        }
        for r, k, s, e in marks
    ]

"""The exact reference: every continuation with p > 0 and its probability under the target."""

from __future__ import annotations

import numpy as np
import torch
from transformers import PreTrainedModel

from specbench.audit.settings import PAD
from specbench.decoding.sampling import SamplingConfig, TokenContext, process_logits


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
    (`process_logits`, each with its own context), expanded level by level with full forwards (no cache).
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
            logits = target_model(input_ids=x).logits[:, -1]  # [M, V]
            context = TokenContext.build(sampling, x.tolist(), [len(prompt)] * len(rows), logits.shape[-1], device)
            p = process_logits(logits, sampling, context).double().cpu().numpy()
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

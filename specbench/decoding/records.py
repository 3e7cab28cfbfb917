"""Raw measurement rows: counts and times only, never derived rates.

Every rate, fit, plot and recommendation is computed from these rows (see
`specbench.analysis`), so a report can be regenerated from `runs/` alone.

Request times, the same for every decoder (speculative, autoregressive, hf_assisted):
the clock starts when the decoder is called (before any prefill). TTFT (`ttft`) ends
when the first new token is available to the user: sampled and on the host (for
hf_assisted, when its streamer receives the first chunk). That moment may deliver
several tokens at once (hf_assisted's first chunk is its first round's accepted + 1
tokens): `first_chunk_tokens` counts them, so the decode phase has
`new_tokens - first_chunk_tokens` tokens in `wall_time - ttft` seconds (dividing by
`new_tokens - 1` would over-count it). specbench's decoders deliver one token first
(the target's prefill samples it) and prefill the draft afterwards, in the decode phase:
`t_draft_prefill` records how long that took (the cost model charges it to the decode phase).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

import pandas as pd

# Decoder names as they appear in the `decoder` column: the engines of `specbench.engines` register
# under them (each with its baseline, runtime and limits); nothing else compares them.
SPECULATIVE = "speculative"
AUTOREGRESSIVE = "autoregressive"
HF_ASSISTED = "hf_assisted"
HF_GENERATE = "hf_generate"  # transformers' generate() on the target alone
LLAMA_CPP = "llama_cpp"  # llama.cpp's llama-server with a draft (specbench.llama_cpp)
LLAMA_CPP_AUTOREGRESSIVE = "llama_cpp_autoregressive"  # the same server binary without one

# How the one extra token of a round was produced.
RECOVERED = "recovered"  # sampled from the residual (p - q)+ at the first rejection
BONUS = "bonus"  # sampled from p at position gamma + 1 after all gamma were accepted
AUTOREGRESSIVE_STEP = "step"  # a plain decoding step (baseline): one token from p


@dataclass
class RoundRecord:
    """One row per (round, batch row). Times are seconds, shared by all rows of a round.

    `accepted` counts drafted tokens that passed the test; `committed` is how many
    tokens the row actually appended (accepted + 1, truncated at EOS/max_new_tokens).
    `t_overhead` is `t_round - t_draft - t_verify` (C_o): sampling, acceptance,
    cache rollback, bookkeeping, host syncs. `host_syncs` counts the host<->device
    syncs specbench's code made in the round (see `specbench.decoding.timing`; shared by all
    rows of a round): 1 for the speculative decoder and the baseline; -1 = not counted.
    """

    round: int  # 0-based round index within the batch
    row: int  # index of the row in the request batch (stable across rounds)
    gamma: int  # the round's gamma: the most it may draft (0 for autoregressive steps); `drafted` = what it did
    accepted: int
    extra: str  # RECOVERED | BONUS | AUTOREGRESSIVE_STEP
    committed: int
    n_active: int  # rows still decoding in this round (the batch the forward saw)
    context_len: int  # committed tokens of this row (prompt + generated) before the round
    t_draft: float  # C_d(gamma)
    t_verify: float  # C_t(gamma + 1), or C_t(1) for an autoregressive step
    t_overhead: float  # C_o
    t_round: float
    host_syncs: int = -1  # explicit host syncs in this round (raw count; -1: producer does not count)
    # The draft-length policy's decision (specbench.decoding.policies): drafts this row verified this round
    # (<= gamma; -1: producer does not say) and why it stopped there (STOP_REASONS; "" for a baseline step).
    drafted: int = -1
    stop: str = ""
    # The draft's confidence at every position it drafted this round (the dropped ones included, so a
    # policy with another tau can be replayed offline): q(x_i) and max_v q_i(v); empty when q was not built.
    q_drafted: list[float] = field(default_factory=list)
    q_max: list[float] = field(default_factory=list)


ROUND_COLUMNS = [f.name for f in fields(RoundRecord)]


@dataclass
class RequestRecord:
    """One row per request (prompt) and decoder run; times as defined in the module docstring."""

    row: int
    prompt_tokens: int
    new_tokens: int
    rounds: int
    wall_time: float  # seconds from the decoder call to the last token of this row
    ttft: float  # seconds from the decoder call to the first new token(s) available to the user
    finished_by: str  # "eos" | "max_new_tokens"
    first_chunk_tokens: int  # new tokens delivered at ttft (1, or hf_assisted's first streamed chunk)
    # Bytes of KV cache this row held when its request finished: allocated columns (padding and
    # rolled-back holes included) x per-column bytes read off the cache tensors; 0 without a cache
    # (n-gram draft, the baseline's draft); NaN where the producer cannot see the cache.
    kv_bytes_target: float = math.nan
    kv_bytes_draft: float = math.nan
    # Seconds the draft's prefill took, after TTFT and before the first round: part of the decode
    # phase, in no round's times. 0 for the baseline; NaN where the producer cannot see it
    # (hf_assisted: its assistant prefills inside its first round, in TTFT).
    t_draft_prefill: float = math.nan


REQUEST_COLUMNS = [f.name for f in fields(RequestRecord)]


def to_frame(records: list, columns: list[str]) -> pd.DataFrame:
    """Records (dataclasses) -> DataFrame with a stable column order, even when empty."""
    return pd.DataFrame([asdict(r) for r in records], columns=columns)


# llama.cpp's own costs (`specbench.llama_cpp.costs`): one row per timed llama-bench repetition.
LLAMA_CT_COLUMNS = ["role", "gguf_type", "n_prompt", "n_gen", "n_depth", "threads", "seconds"]

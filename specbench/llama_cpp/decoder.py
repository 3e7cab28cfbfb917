"""llama.cpp's decoders in the job protocol: its plain decoding and its speculative decoding,
each a `llama-server`, returning the same `DecodeResult` rows as specbench's decoders.

Rows: request rows from the client's clock (wall time and TTFT from the stream) and the
server's counts; round rows from the server's per-round log line ("accepted a/n draft
tokens": a verification round that drafted n and accepted a), with times NaN (llama.cpp does
not time its rounds). Steps that drafted nothing (the last token, an n-gram miss) are not
logged: they are added after the logged rounds as plain steps, so Σ committed = new − 1.
"""

from __future__ import annotations

import math

from specbench.decoding.decoder import DecodeResult
from specbench.decoding.records import AUTOREGRESSIVE_STEP, BONUS, RECOVERED, RequestRecord, RoundRecord
from specbench.decoding.sampling import SamplingConfig
from specbench.llama_cpp.options import SAMPLER_CHAIN, check_sampling
from specbench.llama_cpp.server import Completion, LlamaServer, LlamaServerError


def request_params(sampling: SamplingConfig, seed: int) -> dict:
    """The /completion sampling fields: exactly specbench's chain, every other llama.cpp sampler off."""
    check_sampling(sampling)
    return {
        "samplers": SAMPLER_CHAIN,
        "temperature": float(sampling.temperature),  # 0: llama.cpp keeps the argmax only (greedy)
        "top_k": int(sampling.top_k),  # 0: off
        "top_p": float(sampling.top_p),
        "min_p": float(sampling.min_p),
        "seed": int(seed) % 2**32,
        "n_probs": 0,
        "ignore_eos": False,
    }


def round_records(c: Completion, prompt_tokens: int, new_tokens: int) -> list[RoundRecord]:
    """Round rows of one completion (see the module docstring); the first token is the prefill's."""
    nan = math.nan
    rows, context, left = [], prompt_tokens + 1, max(0, new_tokens - 1)
    for a, n in c.rounds:
        committed = min(a + 1, left)
        extra = BONUS if a == n else RECOVERED
        rows.append(RoundRecord(len(rows), 0, n, a, extra, committed, 1, context, nan, nan, nan, nan))
        context, left = context + committed, left - committed
    while left > 0:  # steps with no draft, positions unknown
        rows.append(RoundRecord(len(rows), 0, 0, 0, AUTOREGRESSIVE_STEP, 1, 1, context, nan, nan, nan, nan))
        context, left = context + 1, left - 1
    return rows


def llama_cpp_decode(
    server: LlamaServer, ids: list[list[int]], sampling: SamplingConfig, max_new_tokens: int, seed: int
) -> DecodeResult:
    """Decode one prompt (batch size 1) with a running llama-server, speculative or not."""
    if len(ids) != 1:
        raise ValueError(f"batch_size={len(ids)}: decoder='llama_cpp' supports batch_size=1 only")
    prompt = ids[0]
    c = server.complete(prompt, request_params(sampling, seed), max_new_tokens)
    new = int(c.timings.get("predicted_n", len(c.tokens)))
    drafted, accepted = int(c.timings.get("draft_n", 0)), int(c.timings.get("draft_n_accepted", 0))
    logged = (sum(a for a, _ in c.rounds), sum(n for _, n in c.rounds))
    if server.spec.speculative and logged != (accepted, drafted):
        raise LlamaServerError(
            f"llama-server logged {logged[0]}/{logged[1]} accepted/drafted tokens over {len(c.rounds)} rounds but "
            f"reported {accepted}/{drafted} (timings.draft_n_accepted/draft_n): the round log is incomplete"
        )
    rounds = round_records(c, len(prompt), new)
    request = RequestRecord(
        row=0,
        prompt_tokens=len(prompt),
        new_tokens=new,
        rounds=len(rounds),
        wall_time=c.wall_time,
        ttft=c.ttft,
        finished_by="eos" if c.stop_type == "eos" else "max_new_tokens",
        first_chunk_tokens=max(1, c.first_chunk_tokens),
    )
    return DecodeResult([list(c.tokens)], rounds, [request])

"""The speculative decoder and its autoregressive baseline, as small free functions.

Both share loading, logits processing (`process_logits`) and timing (`PhaseTimer`),
so the baseline differs from speculation only in how tokens are proposed.

Host syncs: a speculative round makes exactly one (the accepted counts, extra
tokens and drafts come back to the host in one `to_host` copy), an autoregressive
step one (its sampled tokens); everything else the host needs it already has.
Each round records the count it made (`RoundRecord.host_syncs`). A draft-length policy that reads
the draws (`DraftPolicy.reads_confidence`) adds one per draft step (the draft stops once every row's
policy stopped) and one for the rows' lengths, which decide the verify width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from specbench.decoding.acceptance import GREEDY_FORMS, Acceptance, rejection_sample
from specbench.decoding.drafts import Draft
from specbench.decoding.lengths import confidence, done_rule, draft_lengths, verify_q
from specbench.decoding.lm import LM
from specbench.decoding.policies import FIXED, STOP_REASONS, DraftPolicy, next_gamma
from specbench.decoding.records import AUTOREGRESSIVE_STEP, BONUS, RECOVERED, RequestRecord, RoundRecord
from specbench.decoding.sampling import SamplingConfig, TokenContext, next_tokens, process_logits
from specbench.decoding.timing import PhaseTimer, host_syncs, to_device, to_host


@dataclass
class DecodeResult:
    tokens: list[list[int]]  # new tokens per row (EOS included when it ended the row)
    rounds: list[RoundRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)


@dataclass
class _Batch:
    """Committed tokens of every row and which rows are still decoding (in cache order)."""

    seqs: list[list[int]]
    prompt_lens: list[int]
    max_new_tokens: int
    eos: set[int]
    active: list[int] = field(default_factory=list)
    finished_by: dict[int, str] = field(default_factory=dict)
    finish_mark: dict[int, int] = field(default_factory=dict)
    rounds_of: dict[int, int] = field(default_factory=dict)
    kv_bytes: dict[int, tuple[int, int]] = field(default_factory=dict)  # row -> (target, draft) KV bytes at its end
    draft_ready_mark: int | None = None  # timer mark after the draft's prefill (None: no draft, the baseline)
    vocab_size: int = 0  # set at prefill: the size of the processors' context

    def context(
        self, sampling: SamplingConfig, device: torch.device | str, context_class: type[TokenContext] = TokenContext
    ) -> TokenContext | None:
        """The active rows' context for the logits processors (None when no processor reads it)."""
        rows = self.active
        return context_class.build(
            sampling, [self.seqs[r] for r in rows], [self.prompt_lens[r] for r in rows], self.vocab_size, device
        )

    def commit(self, row: int, new: list[int]) -> int:
        """Append up to EOS / max_new_tokens; returns how many tokens were appended."""
        room = self.max_new_tokens - (len(self.seqs[row]) - self.prompt_lens[row])
        new = new[:room]
        for i, tok in enumerate(new):
            if tok in self.eos:
                new = new[: i + 1]
                self.finished_by[row] = "eos"
                break
        self.seqs[row].extend(new)
        self.rounds_of[row] = self.rounds_of.get(row, 0) + 1
        if row not in self.finished_by and len(self.seqs[row]) - self.prompt_lens[row] >= self.max_new_tokens:
            self.finished_by[row] = "max_new_tokens"
        return len(new)

    def stamp(self, mark: int) -> None:
        """Rows that finished since the last stamp finished at this timer mark."""
        for row in self.finished_by:
            self.finish_mark.setdefault(row, mark)

    def drop_finished(self, target: LM, draft: Draft | None = None) -> None:
        """Drop finished rows from the caches, recording the KV bytes each held at its end."""
        keep = [i for i, row in enumerate(self.active) if row not in self.finished_by]
        if len(keep) < len(self.active):
            kv = (target.row_kv_bytes(), draft.row_kv_bytes() if draft is not None else 0)
            for row in self.active:
                if row in self.finished_by:
                    self.kv_bytes.setdefault(row, kv)
            self.active = [self.active[i] for i in keep]
            if self.active:
                for holder in (target, draft) if draft is not None else (target,):
                    holder.select_rows(keep)


def _start(
    target: LM,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos: set[int],
    sampling,
    generator,
    timer,
    draft: Draft | None = None,
) -> tuple[_Batch, int, int]:
    """Prefill the target and commit the first token from its distribution (TTFT ends here,
    with the token on the host), then prefill the draft: the user already has that token."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: need at least one prompt, and every prompt needs at least one token")
    batch = _Batch([list(p) for p in prompts], [len(p) for p in prompts], max_new_tokens, eos)
    batch.active = list(range(len(prompts)))
    start = timer.mark()
    logits = target.prefill(batch.seqs)  # [B, V]
    batch.vocab_size = logits.shape[-1]
    (first,) = to_host(next_tokens(logits, sampling, batch.context(sampling, logits.device), generator))
    first_mark = timer.mark()
    for row, tok in enumerate(first):
        batch.commit(row, [tok])
        batch.rounds_of[row] = 0
    batch.stamp(first_mark)
    if draft is not None:
        draft.prefill(batch.seqs, target)
        batch.draft_ready_mark = timer.mark()
    return batch, start, first_mark


def _requests(batch: _Batch, seconds: list[float], start: int, first_mark: int) -> list[RequestRecord]:
    ready = batch.draft_ready_mark
    draft_prefill = 0.0 if ready is None else seconds[ready] - seconds[first_mark]
    return [
        RequestRecord(
            row=row,
            prompt_tokens=batch.prompt_lens[row],
            new_tokens=len(batch.seqs[row]) - batch.prompt_lens[row],
            rounds=batch.rounds_of[row],
            wall_time=seconds[batch.finish_mark[row]] - seconds[start],
            ttft=seconds[first_mark] - seconds[start],
            finished_by=batch.finished_by[row],
            first_chunk_tokens=1,  # the target's prefill delivers one token
            kv_bytes_target=batch.kv_bytes[row][0],
            kv_bytes_draft=batch.kv_bytes[row][1],
            t_draft_prefill=draft_prefill,
        )
        for row in range(len(batch.seqs))
    ]


def _round_records(pending: list[tuple], seconds: list[float]) -> list[RoundRecord]:
    """One RoundRecord per (round, row) from the marks a decode loop kept (baseline: `decision` None)."""
    rounds = []
    for n, rows, accepted, committed, context, (m0, m1, m2, m3), syncs, decision in pending:
        t_draft, t_verify, t_round = seconds[m1] - seconds[m0], seconds[m2] - seconds[m1], seconds[m3] - seconds[m0]
        for i, row in enumerate(rows):
            gamma, drafted, stop, q_x, q_max = (0, 0, "", [], []) if decision is None else decision.row(i)
            extra = AUTOREGRESSIVE_STEP if decision is None else BONUS if accepted[i] == drafted else RECOVERED
            rounds.append(
                RoundRecord(
                    round=n,
                    row=row,
                    gamma=gamma,
                    accepted=accepted[i],
                    extra=extra,
                    committed=committed[i],
                    n_active=len(rows),
                    context_len=context[i],
                    t_draft=t_draft,
                    t_verify=t_verify,
                    t_overhead=t_round - t_draft - t_verify,
                    t_round=t_round,
                    host_syncs=syncs,
                    drafted=drafted,
                    stop=stop,
                    q_drafted=q_x,
                    q_max=q_max,
                )
            )
    return rounds


def _bits(x: torch.Tensor) -> torch.Tensor:
    """float [B, G] -> its float32 bit patterns as int32, so `to_host`'s one integer copy carries it exactly."""
    return x.float().view(torch.int32)


def _floats(bits: list[list[int]]) -> list[list[float]]:
    """`_bits` back on the host: [B][G] int32 bit patterns -> [B][G] floats."""
    return np.asarray(bits, dtype=np.int64).astype(np.int32).view(np.float32).astype(float).tolist()


@dataclass
class _Decision:
    """A round's draft-length decision per active row, on the host (for its round rows)."""

    gammas: list[int]  # each row's gamma this round
    drafted: list[int]  # drafts each row verified
    stops: list[int]  # index into STOP_REASONS
    q_x: list[list[float]]  # [B][gamma of the round] q(x_i); [] rows when q was not built
    q_max: list[list[float]]

    def row(self, i: int) -> tuple:
        conf = (self.q_x[i][: self.gammas[i]], self.q_max[i][: self.gammas[i]]) if self.q_x else ([], [])
        return self.gammas[i], self.drafted[i], STOP_REASONS[self.stops[i]], *conf


def speculative_decode(
    target: LM,
    draft: Draft,
    prompts: list[list[int]],
    gamma: int,
    sampling: SamplingConfig,
    max_new_tokens: int,
    eos_token_ids: set[int],
    generator: torch.Generator | None = None,
    timer: PhaseTimer | None = None,
    on_round: Callable[[list[list[int]], list[int]], None] | None = None,
    rule: Callable[..., Acceptance] = rejection_sample,
    context_class: type[TokenContext] = TokenContext,
    policy: DraftPolicy = FIXED,
    tau: float = 0.0,
) -> DecodeResult:
    """Draft gamma -> one target forward over gamma + 1 -> commit accepted + recovered/bonus.

    `on_round(seqs, rows)` sees the committed tokens after every round (cache checks in
    tests); `rule` swaps the acceptance rule (under greedy its `GREEDY_FORMS` entry runs, where it has
    one) and `context_class` how the processors' per-position contexts are built (the audit's
    deliberately broken variants). `policy` (with its threshold `tau`) decides how many of up to `gamma`
    drafts each row verifies (`specbench.decoding.policies`); rows of one round may verify different counts.
    """
    if not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma={gamma!r}: must be an integer >= 1")
    timer = timer or PhaseTimer(target.device)
    batch, start, first_mark = _start(target, prompts, max_new_tokens, eos_token_ids, sampling, generator, timer, draft)
    batch.drop_finished(target, draft)
    greedy_form = GREEDY_FORMS.get(rule) if sampling.greedy else None
    with_q = greedy_form is None or policy.reads_confidence  # q [B, G, V] only where something reads it
    done = done_rule(policy, tau) if with_q else None  # lets the draft stop once every row's policy stopped
    gamma_of = dict.fromkeys(batch.active, gamma)  # row -> its gamma next round (a schedule changes it)
    pending: list[tuple] = []
    n_round = 0
    while batch.active:
        seqs = [batch.seqs[r] for r in batch.active]
        context = [len(s) for s in seqs]
        gammas = [gamma_of[r] for r in batch.active]
        m0, syncs0 = timer.mark(), host_syncs()
        token_context = batch.context(sampling, target.device, context_class)  # None when no processor reads it
        # [B, G]: G = the longest row's gamma, or fewer when the policy stopped every row earlier
        drafts, q = draft.propose(seqs, max(gammas), sampling, generator, token_context, with_q=with_q, done=done)
        drafts = drafts.to(target.device)
        q_x, q_max = confidence(drafts, q.to(target.device)) if with_q else (None, None)  # [B, G]
        # what the draft really proposed per row (n-gram lookup without a match, unfilled: nothing)
        proposed = gammas if draft.proposed is None else draft.proposed
        offered = [min(g, n, drafts.shape[1]) for g, n in zip(gammas, proposed)]
        lengths, stops = draft_lengths(policy, q_x, tau, to_device(offered, target.device))  # [B]
        # A policy reading the drawn drafts decides lengths on the device: the host learns them here (a second sync).
        drafted = to_host(lengths)[0] if policy.reads_confidence else offered
        width = max(drafted)  # verify up to the longest row; shorter rows' acceptance is masked by `lengths`
        m1 = timer.mark()
        last = to_device([[s[-1]] for s in seqs], target.device)
        logits = target.feed(torch.cat([last, drafts[:, :width]], 1))  # [B, width + 1, V]
        m2 = timer.mark()
        # Position j of the verify step sees the committed tokens plus drafts[:, :j].
        verify_context = None if token_context is None else token_context.expand(drafts[:, :width])
        ragged = {} if min(drafted) == width else {"lengths": lengths}
        if greedy_form is not None:  # p is one-hot: its argmax decides, q and p [B, G + 1, V] are not built
            result = greedy_form(drafts[:, :width], next_tokens(logits, sampling, verify_context), **ragged)
        else:
            p = process_logits(logits, sampling, verify_context)
            q_rule = verify_q(policy, q[:, :width].to(p.device), tau)
            result = rule(drafts[:, :width], q_rule, p, generator, **ragged)
        # The round's host sync: accepted counts, extra tokens, drafts (and the draft's confidence) in one copy.
        accepted, extra, drafted_tokens, *conf = to_host(
            result.accepted, result.extra_token, drafts, *((stops, _bits(q_x), _bits(q_max)) if with_q else ())
        )
        target.keep_last_fed(width + 1, result.accepted + 1, [a + 1 for a in accepted])
        draft.commit(result.accepted, accepted)  # target, draft and sampling share one device
        rows = list(batch.active)
        committed = [batch.commit(row, drafted_tokens[i][: accepted[i]] + [extra[i]]) for i, row in enumerate(rows)]
        for i, row in enumerate(rows):
            gamma_of[row] = next_gamma(policy, gammas[i], gamma, accepted[i], drafted[i])
        if on_round is not None:
            on_round([batch.seqs[r] for r in rows], rows)
        batch.drop_finished(target, draft)
        m3 = timer.mark()
        batch.stamp(m3)
        stop_codes, q_conf = (conf[0], [_floats(c) for c in conf[1:]]) if conf else ([0] * len(rows), [[], []])
        decision = _Decision(gammas, list(drafted), stop_codes, *q_conf)
        pending.append((n_round, rows, accepted, committed, context, (m0, m1, m2, m3), host_syncs() - syncs0, decision))
        n_round += 1
    seconds = timer.resolve()
    rounds = _round_records(pending, seconds)
    new = [s[n:] for s, n in zip(batch.seqs, batch.prompt_lens)]
    return DecodeResult(new, rounds, _requests(batch, seconds, start, first_mark))


def autoregressive_decode(
    target: LM,
    prompts: list[list[int]],
    sampling: SamplingConfig,
    max_new_tokens: int,
    eos_token_ids: set[int],
    generator: torch.Generator | None = None,
    timer: PhaseTimer | None = None,
) -> DecodeResult:
    """The baseline: one target forward per token, same processing, sampling and timer."""
    timer = timer or PhaseTimer(target.device)
    batch, start, first_mark = _start(target, prompts, max_new_tokens, eos_token_ids, sampling, generator, timer)
    batch.drop_finished(target)
    pending = []
    n_round = 0
    while batch.active:
        seqs = [batch.seqs[r] for r in batch.active]
        context = [len(s) for s in seqs]
        m0, syncs0 = timer.mark(), host_syncs()
        logits = target.feed(to_device([[s[-1]] for s in seqs], target.device))[:, -1]
        m1 = timer.mark()
        # the step's one host sync
        (tokens,) = to_host(next_tokens(logits, sampling, batch.context(sampling, logits.device), generator))
        rows = list(batch.active)
        for i, row in enumerate(rows):
            batch.commit(row, [tokens[i]])
        batch.drop_finished(target)
        m2 = timer.mark()
        batch.stamp(m2)
        # No draft phase: its end mark is the round's start, so t_draft is exactly 0.
        pending.append(
            (n_round, rows, [0] * len(rows), [1] * len(rows), context, (m0, m0, m1, m2), host_syncs() - syncs0, None)
        )
        n_round += 1
    seconds = timer.resolve()
    rounds = _round_records(pending, seconds)
    new = [s[n:] for s, n in zip(batch.seqs, batch.prompt_lens)]
    return DecodeResult(new, rounds, _requests(batch, seconds, start, first_mark))

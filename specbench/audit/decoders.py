"""Decoders under test: named samplers of continuations, built from specbench's decoders,
transformers' assisted generation, or a deliberately broken variant."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel

from specbench.audit.names import BROKEN, POLICY, check_decoder_name, policy_spec, split_name
from specbench.audit.settings import PAD, AuditSettings, derive_seed
from specbench.audit.variants import get_variant
from specbench.decoding.acceptance import rejection_sample
from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.drafts import ModelDraft
from specbench.decoding.forward import ForwardPath, capacity_for
from specbench.decoding.forward_choice import choose_for
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.policies import POLICIES
from specbench.decoding.records import AUTOREGRESSIVE, HF_ASSISTED, SPECULATIVE
from specbench.decoding.sampling import SamplingConfig, TokenContext


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


def pad_rows(rows: list[list[int]], tokens: int) -> np.ndarray:
    """Continuations as an int64 array [n, tokens], PAD after each row's end."""
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
            out.append(pad_rows(run([list(prompt)] * size, tokens, generator), tokens))
            done, b = done + size, b + 1
        return np.concatenate(out)

    return sample


def speculative_decoder(
    target_model: PreTrainedModel,
    draft_model: PreTrainedModel,
    gamma: int,
    sampling: SamplingConfig,
    eos_token_ids: set[int] = frozenset(),
    batch_size: int = 1024,
    variant: str | None = None,
    batched_prefill: bool = True,
    forward: str = "eager",
    policy: str = "fixed",
    tau: float = 0.0,
) -> DecoderUnderTest:
    """specbench's `speculative_decode` with a model draft, or one of its broken variants; `forward`
    is the forward path (eager: the reference cache; static / compiled: the fast path); `policy` and `tau`
    its draft-length policy (`specbench.decoding.policies`)."""
    v = get_variant(variant) if variant else None
    forward = choose_for(forward, "default", str(target_model.device), target_model.config, draft_model.config).path

    def run(prompts, tokens, generator):
        if forward == "eager":
            lm_class = SharedPrefillLM if batched_prefill else CachedLM
        else:  # one StaticLM per model and capacity for the whole audit: compiled once
            lm_class = ForwardPath(forward, "default", capacity_for([len(p) for p in prompts], tokens, gamma)).lm
        draft = v.new_draft(draft_model) if v else ModelDraft(draft_model, name="draft")
        draft.lm = lm_class(draft_model)
        result = speculative_decode(
            lm_class(target_model),
            draft,
            prompts,
            gamma,
            sampling,
            tokens,
            set(eos_token_ids),
            generator,
            rule=v.rule if v else rejection_sample,
            context_class=v.context_class if v else TokenContext,
            policy=POLICIES.get(policy),
            tau=tau,
        )
        return result.tokens

    name = f"{BROKEN}:{variant}" if variant else SPECULATIVE if forward == "eager" else f"{SPECULATIVE}:{forward}"
    if policy != "fixed":
        name = f"{POLICY}:{policy}" + (f"@{tau:g}" if POLICIES.get(policy).reads_confidence else "")
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
        return autoregressive_decode(
            lm_class(target_model), prompts, sampling, tokens, set(eos_token_ids), generator
        ).tokens

    return DecoderUnderTest(AUTOREGRESSIVE, _batched(run, batch_size), None, first_speculative_token=0)


def hf_assisted_decoder(
    target_model: PreTrainedModel,
    draft_model: PreTrainedModel,
    gamma: int,
    sampling: SamplingConfig,
    eos_token_ids: set[int] = frozenset(),
    confidence_threshold: float = 0.0,
) -> DecoderUnderTest:
    """transformers' assisted generation, one continuation per `generate` call (batch size 1);
    `confidence_threshold`: its own draft-length policy (`assistant_confidence_threshold`)."""
    from specbench.decoding.hf_assisted import hf_assisted_decode
    from specbench.decoding.timing import PhaseTimer

    def sample(prompt, n, tokens, seed):
        timer = PhaseTimer(target_model.device)
        rows = []
        for i in range(n):
            timer.reset()
            result = hf_assisted_decode(
                target_model,
                draft_model,
                [list(prompt)],
                gamma,
                sampling,
                tokens,
                set(eos_token_ids),
                derive_seed(seed, i),
                timer,
                confidence_threshold,
            )
            rows.append(result.tokens[0])
        return pad_rows(rows, tokens)

    name = f"{HF_ASSISTED}@{confidence_threshold:g}" if confidence_threshold else HF_ASSISTED
    return DecoderUnderTest(name, sample, gamma, first_speculative_token=1)


def make_decoder(
    name: str, target, draft, gamma: int, sampling: SamplingConfig, eos: set[int], settings: AuditSettings
) -> DecoderUnderTest:
    """The decoder under test called `name` (see `DECODER_CHOICES`; llama.cpp's: `specbench.audit.llama_cpp`)."""
    check_decoder_name(name)
    base, variant, at = split_name(name)
    if base == POLICY:
        policy, tau = policy_spec(name)
        return speculative_decoder(target, draft, gamma, sampling, eos, settings.batch_size, policy=policy, tau=tau)
    if base == BROKEN:
        return speculative_decoder(target, draft, gamma, sampling, eos, settings.batch_size, variant=variant)
    builders = {
        SPECULATIVE: lambda: speculative_decoder(
            target, draft, gamma, sampling, eos, settings.batch_size, forward=variant or "eager"
        ),
        AUTOREGRESSIVE: lambda: autoregressive_decoder(target, sampling, eos, settings.batch_size),
        # hf_assisted@tau: with its assistant_confidence_threshold
        HF_ASSISTED: lambda: hf_assisted_decoder(target, draft, gamma, sampling, eos, float(at or 0.0)),
    }
    if base not in builders:
        raise ValueError(f"audit.decoder={name!r}: a llama-server decoder, run by specbench.audit.llama_cpp")
    return builders[base]()

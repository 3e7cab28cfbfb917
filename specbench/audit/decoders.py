"""Decoders under test: named samplers of continuations, built from specbench's decoders,
transformers' assisted generation, or a deliberately broken variant."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel

from specbench.audit.settings import PAD, AuditSettings, derive_seed
from specbench.audit.variants import get_variant
from specbench.decoding.acceptance import rejection_sample
from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.drafts import ModelDraft
from specbench.decoding.forward import ForwardPath, capacity_for
from specbench.decoding.forward_choice import choose_for
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.policies import POLICIES
from specbench.decoding.records import AUTOREGRESSIVE, HF_ASSISTED, LLAMA_CPP, LLAMA_CPP_AUTOREGRESSIVE, SPECULATIVE
from specbench.decoding.sampling import SamplingConfig, TokenContext
from specbench.engines import SERVER, runs_in

# The engines the audit samples from (`specbench.engines`), each with the `:<variant>`s it takes ("" = none):
# speculative:<path>: specbench's decoder on the fast path (`specbench.decoding.forward`; compiled: inductor
# default; auto: as `forward_choice` resolves it, named by what ran); llama.cpp's run through llama-server (`specbench.audit.llama_cpp`; reference: its own plain decoding).
AUDITED = {
    SPECULATIVE: ("", "auto", "static", "compiled"),
    AUTOREGRESSIVE: ("",),
    HF_ASSISTED: ("",),
    LLAMA_CPP: ("", "probabilistic"),
    LLAMA_CPP_AUTOREGRESSIVE: ("",),
}
# Audit-only names: the speculative decoder broken on purpose, or under a draft-length policy.
BROKEN, POLICY = "broken", "policy"
# Where `@<value>` is an engine's own draft-length policy: hf_assisted's assistant_confidence_threshold,
# llama.cpp probabilistic drafting's --spec-draft-p-min.
WITH_AT = {(HF_ASSISTED, ""): "<assistant_confidence_threshold>", (LLAMA_CPP, "probabilistic"): "<--spec-draft-p-min>"}
DECODER_NAMES = tuple(f"{e}:{v}" if v else e for e, variants in AUDITED.items() for v in variants)
DECODER_CHOICES = (
    " | ".join(DECODER_NAMES)
    + f" | {BROKEN}:<variant> | {POLICY}:<draft policy>[@tau] | "
    + " | ".join(f"{e}{':' + v if v else ''}@{what}" for (e, v), what in WITH_AT.items())
)
POLICY_TAU = 0.3  # policy:<name> without @tau


def split_name(name: str) -> tuple[str, str, str]:
    """'llama_cpp:probabilistic@0.5' -> ('llama_cpp', 'probabilistic', '0.5'); 'hf_assisted' -> ('hf_assisted', '', '')."""
    head, _, at = name.partition("@")
    base, _, variant = head.partition(":")
    return base, variant, at


def policy_spec(name: str) -> tuple[str, float]:
    """'policy:prune_naive@0.3' -> ('prune_naive', 0.3): the speculative decoder under a draft-length policy
    (any of `POLICIES`, the audit-only broken one included), with its threshold tau."""
    policy, _, tau = name.removeprefix("policy:").partition("@")
    POLICIES.get(policy, "audit.decoder policy")
    try:
        value = float(tau) if tau else POLICY_TAU
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"audit.decoder={name!r}: tau {tau!r} must be a probability in [0, 1]")
    return policy, value


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


def is_llama_cpp(name: str) -> bool:
    """A decoder the audit runs as llama-server requests (`specbench.audit.llama_cpp`)."""
    base, variant, _ = split_name(name)
    return base in AUDITED and variant in AUDITED[base] and runs_in(base, SERVER)


def llama_cpp_p_min(name: str) -> float:
    """`llama_cpp:probabilistic@<p>`'s --spec-draft-p-min (0 without one): llama.cpp's own draft-length policy."""
    if "@" not in name:
        return 0.0
    text = name.partition("@")[2]
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"audit.decoder={name!r}: --spec-draft-p-min {text!r} must be a number in [0, 1]")
    return value


def check_decoder_name(name: str) -> None:
    """A ValueError naming the choices unless `name` is a decoder the audit can build."""
    base, variant, at = split_name(name)
    if base == BROKEN:
        get_variant(name.removeprefix(f"{BROKEN}:"))
    elif base == POLICY:
        policy_spec(name)
    elif base in AUDITED and variant in AUDITED[base] and (not at or (base, variant) in WITH_AT):
        if at and runs_in(base, SERVER):
            llama_cpp_p_min(name)
        elif at:
            policy_spec(f"{POLICY}:confidence_stop@{at}")
    else:
        raise ValueError(f"audit.decoder={name!r}: must be {DECODER_CHOICES}")


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

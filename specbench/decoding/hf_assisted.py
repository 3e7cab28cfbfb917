"""transformers' own assisted generation (speculative sampling), as a specbench decoder.

`hf_assisted_decode` runs `target.generate(..., assistant_model=draft)` with a fixed
speculation length gamma and the same sampling settings as specbench's decoder, and
returns a `DecodeResult` whose requests carry wall time, TTFT and token counts. Its
phases cannot be split (the draft, verify and overhead happen inside `generate`), so
`rounds` is empty; `RequestRecord.rounds` counts the target forwards (prefill included).
TTFT ends when the streamer receives the first chunk: the first round's accepted + 1
tokens, counted in `RequestRecord.first_chunk_tokens` (see `specbench.decoding.records`).

How transformers 5.x reads the settings (checked in `generation/candidate_generator.py`):
`num_assistant_tokens`, `num_assistant_tokens_schedule` and
`assistant_confidence_threshold` are read from the *assistant's* `generation_config`, not
from the `generate` kwargs, so they are set there for the call (and restored after), and so
is its `eos_token_id` (with no EOS requested, the draft would otherwise stop drafting at its
model's default EOS);
`assistant_confidence_threshold=0` disables the early stop on low draft confidence, and
the "constant" schedule keeps gamma fixed. A sampling knob left unset (None) falls back
to the model's generation config and then to transformers' global defaults (top_k=50
among them). The assistant's own `generate` gets a copy of the main call's config and
fills its None values that way, so an unset top-k became top-k 50 in q only (lossless,
but acceptance understated): top_k=0 is passed as an explicit 0 ("off"), and every
sampling knob is also set on the assistant's generation config for the call.
Repetition penalty, banned tokens / sequences (`bad_words_ids`) and min-p map onto
transformers' own processors; frequency and presence penalties have none, and a one-token
ban of an EOS id is dropped by transformers, so `check_sampling` refuses those.
"""

from __future__ import annotations

import math

import torch
from transformers import PreTrainedModel
from transformers.generation.streamers import BaseStreamer

from specbench.decoding.decoder import DecodeResult
from specbench.decoding.kvcache import cache_row_kv_bytes
from specbench.decoding.records import RequestRecord
from specbench.decoding.sampling import SamplingConfig
from specbench.decoding.timing import PhaseTimer

# Every other logits transform generate() could pick up from a model's generation_config,
# switched off explicitly (an explicit None overrides the model's value; omitting it does not).
_NEUTRAL = dict(
    min_length=0,
    min_new_tokens=None,
    repetition_penalty=None,
    encoder_repetition_penalty=None,
    no_repeat_ngram_size=None,
    encoder_no_repeat_ngram_size=None,
    bad_words_ids=None,
    sequence_bias=None,
    suppress_tokens=None,
    begin_suppress_tokens=None,
    forced_bos_token_id=None,
    forced_eos_token_id=None,
    exponential_decay_length_penalty=None,
    guidance_scale=None,
    min_p=None,
    typical_p=None,
    top_h=None,
    epsilon_cutoff=None,
    eta_cutoff=None,
    watermarking_config=None,
    renormalize_logits=False,
)
# The generate kwargs that decide how tokens are chosen: mirrored onto the assistant's generation config.
# Length limits are not: the candidate generator sets the assistant's own (copying ours made
# transformers warn on every call that both min_new_tokens and min_length were set).
_SAMPLING_KEYS = (
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    *(k for k in _NEUTRAL if not k.startswith("min_")),
    "min_p",
)


class FirstTokenMark(BaseStreamer):
    """`generate` puts the prompt first, then each round's new tokens: mark the first of those."""

    def __init__(self, timer: PhaseTimer) -> None:
        self.timer, self.puts, self.first_mark, self.first_chunk_tokens = timer, 0, None, 0

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.first_mark is None:
            self.first_mark = self.timer.mark()
            self.first_chunk_tokens = value.numel()  # [1, accepted + 1]: batch size 1

    def end(self) -> None:
        pass


def generate_kwargs(sampling: SamplingConfig, max_new_tokens: int, eos_token_ids: set[int]) -> dict:
    """The `generate` kwargs that reproduce specbench's processing of p and q."""
    eos = sorted(eos_token_ids)
    kwargs = dict(
        max_new_tokens=max_new_tokens,
        eos_token_id=eos or None,  # None: no EOS at all (not the model's default)
        pad_token_id=eos[0] if eos else 0,
        do_sample=not sampling.greedy,
        **_NEUTRAL,
    )
    if not sampling.greedy:
        kwargs.update(
            temperature=float(sampling.temperature),
            top_k=sampling.top_k,  # 0 = off; None would mean "unset" and become 50 in the assistant
            top_p=float(sampling.top_p),
            min_p=float(sampling.min_p) if sampling.min_p > 0 else None,
        )
    # Penalties and bans are processors, not warpers: transformers applies them in greedy decoding too.
    banned = [[t] for t in sampling.banned_token_ids] + [list(s) for s in sampling.banned_sequences]
    kwargs.update(
        repetition_penalty=float(sampling.repetition_penalty) if sampling.repetition_penalty != 1.0 else None,
        bad_words_ids=banned or None,
    )
    return kwargs


def check_sampling(sampling: SamplingConfig, eos_token_ids: set[int]) -> None:
    """A ValueError for the settings transformers' generate cannot reproduce exactly."""
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(sampling, name) != 0.0:
            raise ValueError(
                f"sampling.{name}={getattr(sampling, name)!r}: transformers' generate has no "
                f"frequency/presence penalty (OpenAI semantics), so decoder='hf_assisted' cannot "
                f"apply it; use 0.0, or repetition_penalty (transformers' semantics)"
            )
    banned_eos = sorted(set(sampling.banned_ids) & set(eos_token_ids))
    if banned_eos:
        raise ValueError(
            f"sampling.banned_token_ids includes EOS {banned_eos}: transformers' bad_words_ids silently "
            "drops a one-token ban of an EOS id, so decoder='hf_assisted' would not ban it"
        )


def hf_assisted_decode(
    target_model: PreTrainedModel,
    draft_model: PreTrainedModel,
    prompts: list[list[int]],
    gamma: int,
    sampling: SamplingConfig,
    max_new_tokens: int,
    eos_token_ids: set[int],
    generator_seed: int,
    timer: PhaseTimer,
    confidence_threshold: float = 0.0,
) -> DecodeResult:
    """One prompt (batch size 1: transformers' assisted generation does not batch) with a fixed gamma.
    `confidence_threshold`: the assistant's `assistant_confidence_threshold` (0: drafts gamma every round).

    Seeds the global RNG with `torch.manual_seed(generator_seed)` (generate draws from it).
    """
    if len(prompts) != 1:
        raise ValueError(
            f"hf_assisted decoder: got a batch of {len(prompts)} prompts, but transformers' assisted generation "
            "supports batch size 1 only; run it with batch_size=1 (one prompt per call)"
        )
    if draft_model is None:
        raise ValueError(
            "hf_assisted decoder needs a draft model (draft.kind='model' or 'w8a16'); "
            "n-gram drafts are not supported by it"
        )
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
        raise ValueError(f"gamma={gamma!r}: must be an integer >= 1")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
    prompt = list(prompts[0])
    if not prompt:
        raise ValueError("prompts: every prompt needs at least one token")

    check_sampling(sampling, eos_token_ids)
    kwargs = generate_kwargs(sampling, max_new_tokens, eos_token_ids)
    assistant_config = draft_model.generation_config
    assistant_settings = dict(
        num_assistant_tokens=gamma,
        num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=float(confidence_threshold),
        # The assistant's own generate() fills an EOS the main call leaves unset (None) from the
        # draft's generation_config, and would stop drafting there: give it the same EOS set.
        eos_token_id=kwargs["eos_token_id"],
        # Likewise every sampling knob: q must be processed exactly as p (no top-k 50 from defaults).
        **{key: kwargs[key] for key in _SAMPLING_KEYS if key in kwargs},
    )
    saved = {key: getattr(assistant_config, key, None) for key in assistant_settings}
    forwards = [0]
    hook = target_model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    streamer = FirstTokenMark(timer)
    input_ids = torch.tensor([prompt], device=target_model.device)
    try:
        for key, value in assistant_settings.items():
            setattr(assistant_config, key, value)
        torch.manual_seed(generator_seed)
        start = timer.mark()
        with torch.inference_mode():
            out = target_model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                assistant_model=draft_model,
                streamer=streamer,
                return_dict_in_generate=True,  # for the target's cache (its KV bytes)
                **kwargs,
            )
        end = timer.mark()
    finally:
        hook.remove()
        for key, value in saved.items():
            setattr(assistant_config, key, value)
    new = out.sequences[0, len(prompt) :].tolist()
    cache = getattr(out, "past_key_values", None)
    seconds = timer.resolve()
    first = streamer.first_mark if streamer.first_mark is not None else end
    record = RequestRecord(
        row=0,
        prompt_tokens=len(prompt),
        new_tokens=len(new),
        rounds=forwards[0],
        wall_time=seconds[end] - seconds[start],
        ttft=seconds[first] - seconds[start],
        finished_by="eos" if new and new[-1] in eos_token_ids else "max_new_tokens",
        first_chunk_tokens=streamer.first_chunk_tokens if streamer.first_mark is not None else len(new),
        kv_bytes_target=cache_row_kv_bytes(cache) if cache is not None else math.nan,
        # The assistant's cache lives inside transformers' candidate generator, out of reach: NaN.
        kv_bytes_draft=math.nan,
    )
    return DecodeResult(tokens=[new], rounds=[], requests=[record])

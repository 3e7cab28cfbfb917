"""transformers' own assisted generation (speculative sampling), as a specbench decoder.

`hf_assisted_decode` runs `target.generate(..., assistant_model=draft)` with a fixed
speculation length gamma and the same sampling settings as specbench's decoder, and
returns a `DecodeResult` whose requests carry wall time, TTFT and token counts. Its
phases cannot be split (the draft, verify and overhead happen inside `generate`), so
`rounds` is empty; `RequestRecord.rounds` counts the target forwards (prefill included).

How transformers 5.x reads the settings (checked in `generation/candidate_generator.py`):
`num_assistant_tokens`, `num_assistant_tokens_schedule` and
`assistant_confidence_threshold` are read from the *assistant's* `generation_config`, not
from the `generate` kwargs, so they are set there for the call (and restored after), and so
is its `eos_token_id` (with no EOS requested, the draft would otherwise stop drafting at its
model's default EOS);
`assistant_confidence_threshold=0` disables the early stop on low draft confidence, and
the "constant" schedule keeps gamma fixed. A sampling knob left out of `generate` falls
back to the model's generation config and then to transformers' global defaults (top_k=50
among them), so temperature, top_k and top_p are always passed explicitly
(top_k=0 -> None, i.e. no top-k filter).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel
from transformers.generation.streamers import BaseStreamer

from specbench.decoding.decoder import DecodeResult
from specbench.decoding.records import RequestRecord
from specbench.decoding.sampling import SamplingConfig
from specbench.decoding.timing import PhaseTimer

# Every other logits transform generate() could pick up from a model's generation_config,
# switched off explicitly (an explicit None overrides the model's value; omitting it does not).
_NEUTRAL = dict(
    min_length=0, min_new_tokens=None, repetition_penalty=None, encoder_repetition_penalty=None,
    no_repeat_ngram_size=None, encoder_no_repeat_ngram_size=None, bad_words_ids=None, sequence_bias=None,
    suppress_tokens=None, begin_suppress_tokens=None, forced_bos_token_id=None, forced_eos_token_id=None,
    exponential_decay_length_penalty=None, guidance_scale=None, min_p=None, typical_p=None, top_h=None,
    epsilon_cutoff=None, eta_cutoff=None, watermarking_config=None, renormalize_logits=False,
)  # fmt: skip
_ASSISTANT_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
                   "eos_token_id")


class _FirstTokenMark(BaseStreamer):
    """`generate` puts the prompt first, then each round's new tokens: mark the first of those."""

    def __init__(self, timer: PhaseTimer) -> None:
        self.timer, self.puts, self.first_mark = timer, 0, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.first_mark is None:
            self.first_mark = self.timer.mark()

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
            top_k=sampling.top_k if sampling.top_k > 0 else None,
            top_p=float(sampling.top_p),
        )
    return kwargs


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
) -> DecodeResult:
    """One prompt (batch size 1: transformers' assisted generation does not batch) with a fixed gamma.

    Seeds the global RNG with `torch.manual_seed(generator_seed)` (generate draws from it).
    """
    if len(prompts) != 1:
        raise ValueError(
            f"hf_assisted decoder: got a batch of {len(prompts)} prompts, but transformers' assisted generation "
            "supports batch size 1 only; run it with batch_size=1 (one prompt per call)"
        )
    if draft_model is None:
        raise ValueError("hf_assisted decoder needs a draft model (draft.kind='model' or 'w8a16'); "
                         "n-gram drafts are not supported by it")  # fmt: skip
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
        raise ValueError(f"gamma={gamma!r}: must be an integer >= 1")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
    prompt = list(prompts[0])
    if not prompt:
        raise ValueError("prompts: every prompt needs at least one token")

    kwargs = generate_kwargs(sampling, max_new_tokens, eos_token_ids)
    assistant_config = draft_model.generation_config
    saved = {key: getattr(assistant_config, key, None) for key in _ASSISTANT_KEYS}
    forwards = [0]
    hook = target_model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    streamer = _FirstTokenMark(timer)
    input_ids = torch.tensor([prompt], device=target_model.device)
    try:
        assistant_config.num_assistant_tokens = gamma
        assistant_config.num_assistant_tokens_schedule = "constant"
        assistant_config.assistant_confidence_threshold = 0.0
        # The assistant's own generate() fills an EOS the main call leaves unset (None) from the
        # draft's generation_config, and would stop drafting there: give it the same EOS set.
        assistant_config.eos_token_id = kwargs["eos_token_id"]
        torch.manual_seed(generator_seed)
        start = timer.mark()
        with torch.inference_mode():
            out = target_model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                assistant_model=draft_model,
                streamer=streamer,
                **kwargs,
            )
        end = timer.mark()
    finally:
        hook.remove()
        for key, value in saved.items():
            setattr(assistant_config, key, value)
    new = out[0, len(prompt) :].tolist()
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
    )
    return DecodeResult(tokens=[new], rounds=[], requests=[record])

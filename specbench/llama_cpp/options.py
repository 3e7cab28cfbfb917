"""What specbench can ask of llama.cpp: GGUF types, draft kinds, draft sampling modes and the
sampling settings it can drive (imported by the config, so it imports nothing at load time)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specbench.decoding.sampling import SamplingConfig

GGUF_TYPES = ("Q4_1", "Q4_0", "Q5_1", "Q8_0", "F16", "BF16", "F32")  # what llama-quantize writes for specbench
# Drafts with no model. ngram-mod is left out on purpose: its table outlives a request, so a
# repeated prompt replays the previous answer (state leaking between measured requests).
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache")
DRAFT_SAMPLING = ("greedy", "probabilistic")  # argmax draft + match (llama.cpp's default) | sampled + rejection
SAMPLER_CHAIN = ["temperature", "top_k", "top_p", "min_p"]  # specbench's (and transformers') order


def check_sampling(sampling: SamplingConfig) -> None:
    """llama.cpp is driven with temperature, top-k, top-p and min-p only; raise naming anything else."""
    from specbench.decoding.sampling import CONTEXT_FIELDS  # torch: loaded on use, not with the config

    for name in CONTEXT_FIELDS:
        value = getattr(sampling, name)
        if value not in (1.0, 0.0, (), None):
            raise ValueError(
                f"sampling.{name}={value!r}: decoder='llama_cpp' supports temperature, top_k, top_p and "
                "min_p only (llama.cpp's penalties use another window and semantics than specbench's)"
            )

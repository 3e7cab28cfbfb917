"""How the fast path compiles a forward (`compiled_forward`), and inductor's on-disk cache, one folder per CPU ISA.

Inductor generates AVX2 or AVX-512 code by the ISA it picks (`ATEN_CPU_CAPABILITY` chooses it), but its FX-graph
cache key leaves the ISA out. A process forced to AVX2 on an AVX-512 machine reused graphs compiled without the
force and computed NaN logits (tests/test_fast_path.py::test_a_cache_filled_under_another_isa_is_not_reused). So
every compile goes to a sub-folder named after the ISA, under the user's TORCHINDUCTOR_CACHE_DIR or inductor's
default: the cache still persists across jobs and processes, never across ISAs.
"""

from __future__ import annotations

import os
import re
import types

import torch
from transformers import PreTrainedModel

from specbench.models.matvec_fusion import FUSION_PASS

KEY_PREFIX = "isa-"
# A CPU graph runs from inductor's C++ wrapper, not its Python one: each of a step's ~300 kernel and op calls cost the
# Python wrapper a few microseconds. Compiled steps 5-8% shorter, ~15 s more compile a graph
# (analysis/fast_path_cpp_wrapper_cpu_amx/, whose side-by-side run turns it off for its old side).
CPP_WRAPPER = True


def keyed_cache_dir() -> str:
    """Point TORCHINDUCTOR_CACHE_DIR at this ISA's sub-folder (once per process) and return it."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    if os.path.basename(base.rstrip(os.sep)).startswith(KEY_PREFIX):
        return base
    isa = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(pick_vec_isa()).strip()) or "none"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path = os.path.join(base, KEY_PREFIX + isa)
    return path


def concat_linears(model: PreTrainedModel) -> bool:
    """Whether a compile of `model` runs its linears that share an input (q/k/v, gate/up) as one GEMM
    (`compiled_forward`): as the model tags itself (`config.specbench_concat_linears`: W4A16 copies), else
    for float32 weights on CPU, where it shortens the target's step a little at every k (profile_step.py)."""
    tagged = getattr(model.config, "specbench_concat_linears", None)
    if tagged is not None:
        return bool(tagged)
    return model.device.type == "cpu" and model.dtype == torch.float32


def compiled_forward(step, mode: str, device: torch.device, concat_linears: bool = False):
    """`torch.compile` of a forward with its weights frozen (prepacked once, as constants).

    CPU, "max-autotune": inductor's C++ GEMM templates are timed against ATen per shape; at M = 1
    they stream the weights much faster than eager's oneDNN call on the CPUs measured. CUDA:
    inductor's "max-autotune" mode (Triton GEMMs and CUDA graphs). "default": freezing only.
    The settings are inductor's process-wide config (`torch.compile(options=...)` did not apply
    freezing here), so every later compile in the process gets them too; `concat_linears` alone is
    per compile (`concat_linears`): on CPU, linears that share an input (q/k/v, gate/up) run as one
    GEMM. It paid for int4 and fp32 weights, cost int8's and was even for bf16 (`scripts/profile_step.py
    --concat-linears off / on`; analysis/fast_path_w4a16h8_concat_cpu_amx/), so W4A16 copies and fp32 get it.
    specbench's weight-only ops (fp32 drafts) are fused the same way by `matvec_fusion.FUSION_PASS`. On CPU the
    graph runs from inductor's C++ wrapper (`CPP_WRAPPER`).
    """
    import torch._inductor.config as inductor

    keyed_cache_dir()  # inductor's cache per CPU ISA
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    inductor.freezing = True
    # Inductor inlines a pointwise producer into its consumers unless its body is long. On CPU its
    # default limit (50 ops) let q's rotary embedding (cos, sin, mul, add) be recomputed for every key
    # column inside the fused attention reduction, a third of a W4A16 draft step in the profile
    # (scripts/profile_step.py). Realizing producers past 10 ops stores q once and halves that layer's cost.
    if hasattr(inductor, "realize_cpu_opcount_threshold"):  # absent in torch 2.11 (the GPU image's)
        inductor.realize_cpu_opcount_threshold = min(inductor.realize_cpu_opcount_threshold, 10)
    # specbench's weight-only ops on one input (q/k/v, gate/up) run as one call (`matvec_fusion`)
    if inductor.post_grad_custom_pre_pass is None:
        inductor.post_grad_custom_pre_pass = FUSION_PASS
    step = own_code(step)
    if device.type != "cpu":
        return torch.compile(step, mode=mode, dynamic=False)
    # The wrapper's Python checks of every input's and custom op output's strides (~360 a W4A16 draft step) guard
    # StaticLM's own buffers, one graph per (S, k): off, a draft step is ~2-3% shorter (profile_step.py)
    inductor.size_asserts = inductor.alignment_asserts = False
    if mode == "max-autotune":
        inductor.max_autotune = True
        inductor.max_autotune_gemm_backends = "CPP,ATEN"
    # No `mode` on CPU ("default" is no mode; max-autotune is the config above): torch.compile takes one or options.
    options = {"cpp_wrapper": CPP_WRAPPER} | ({"cpp.enable_concat_linear": True} if concat_linears else {})
    return torch.compile(step, dynamic=False, options=options)


def own_code(step):
    """`step` (a function or bound method) over a copy of its code object, so its compiled graphs are its own.

    Dynamo keeps graphs per code object, and a graph's frozen static-address tensors (a StaticLM's KV buffers)
    are its constants, guarded by shape, not identity: a second StaticLM of one model and capacity ran the first
    one's graphs over the first one's cache (tests/test_fast_path.py::test_two_static_lms_of_one_model_keep_their_own_caches)."""
    fn = getattr(step, "__func__", step)
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    return types.MethodType(copy, step.__self__) if hasattr(step, "__func__") else copy

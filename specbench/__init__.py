"""specbench: benchmarks, cost model and lossless audit for speculative decoding."""

from __future__ import annotations

import os
from typing import Any

# ATEN_CPU_CAPABILITY=avx2 (or default) stands for a CPU without AVX-512, but on an AMX CPU torch's bf16 flash
# attention still asks oneDNN for AMX packing and fails ("pack_vnni2 is only supported when avx512 is supported"):
# cap oneDNN at AVX2 too, before its first use, unless the user set it (analysis/gamma_sweep_fast_path_cpu_avx2_path/).
if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() in ("avx2", "default"):
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

__all__ = ["DecodeOutput", "decode"]


def __getattr__(name: str) -> Any:
    # Lazy: `import specbench.bench.runstore` must not pay for torch and transformers.
    if name in __all__:
        from specbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'specbench' has no attribute {name!r}")

"""Inductor's on-disk cache, one folder per CPU vector ISA.

Inductor generates AVX2 or AVX-512 code by the ISA it picks (`ATEN_CPU_CAPABILITY` chooses it), but its FX-graph
cache key leaves the ISA out. A process forced to AVX2 on an AVX-512 machine reused graphs compiled without the
force and computed NaN logits (tests/test_fast_path.py::test_a_cache_filled_under_another_isa_is_not_reused). So
every compile goes to a sub-folder named after the ISA, under the user's TORCHINDUCTOR_CACHE_DIR or inductor's
default: the cache still persists across jobs and processes, never across ISAs.
"""

from __future__ import annotations

import os
import re

KEY_PREFIX = "isa-"


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

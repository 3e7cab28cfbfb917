"""specbench: benchmarks, cost model and lossless audit for speculative decoding."""

from __future__ import annotations

from typing import Any

__all__ = ["DecodeOutput", "decode"]


def __getattr__(name: str) -> Any:
    # Lazy: `import specbench.bench.runstore` must not pay for torch and transformers.
    if name in __all__:
        from specbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'specbench' has no attribute {name!r}")

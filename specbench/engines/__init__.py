"""Decoding engines behind one protocol (`base.Engine`: open, decode, close), in one registry
(`ENGINES`, keyed by the `decoder` column's values). Adding an engine is one `register` call; the
config's `decoder` / `extra_decoders` choices, the job protocol, the report and the analysis's
baseline pairing read the registry. See docs/engines.md."""

# Registration order is the order reports list engines in: specbench's own first.
from specbench.engines import specbench_decoders  # noqa: F401, I001  (registrations)
from specbench.engines import hf, llama_cpp  # noqa: F401, I001
from specbench.engines.base import (
    ENGINES,
    SERVER,
    TORCH,
    Engine,
    Session,
    TorchSession,
    baseline_names,
    baseline_of,
    engine,
    has_timed_rounds,
    is_baseline,
    open_engines,
    register,
    runs_in,
    speculative_names,
)

__all__ = [
    "ENGINES",
    "SERVER",
    "TORCH",
    "Engine",
    "Session",
    "TorchSession",
    "baseline_names",
    "baseline_of",
    "engine",
    "has_timed_rounds",
    "is_baseline",
    "open_engines",
    "register",
    "runs_in",
    "speculative_names",
]

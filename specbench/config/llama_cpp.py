"""decoder=llama_cpp's engine settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from specbench.config.checks import at_least, choice
from specbench.llama_cpp.options import DRAFT_SAMPLING, GGUF_TYPES, NGRAM_TYPES


@dataclass
class LlamaCppConfig:
    """decoder=llama_cpp: llama.cpp's llama-server, with and without a draft (`specbench.llama_cpp`).

    target/draft are GGUF types of the embedded model (the shipped Q4_1, or a copy made once with
    llama-quantize); draft may instead be an n-gram lookup type. γ is --spec-draft-n-max.
    """

    target: str = "F16"
    draft: str = "Q4_1"
    draft_min: int = 0  # --spec-draft-n-min: pinned so every round drafts up to γ
    draft_p_min: float = 0.0  # --spec-draft-p-min: 0 = never stop a draft early on low confidence
    draft_sampling: str = "greedy"  # llama.cpp's default: argmax draft, accept while it matches the target's sample
    threads: Optional[int] = None  # None: the job's `threads`, else every core this process may use
    ctx_size: int = 4096
    port: int = 0  # 0: a free port per server
    startup_timeout: float = 120.0
    bin_dir: Optional[str] = None  # None: $SPECBENCH_LLAMA_CPP_BIN, the build cache, then PATH

    def __post_init__(self) -> None:
        choice("llama_cpp.target", self.target, GGUF_TYPES)
        choice("llama_cpp.draft", self.draft, GGUF_TYPES + NGRAM_TYPES)
        choice("llama_cpp.draft_sampling", self.draft_sampling, DRAFT_SAMPLING)
        at_least("llama_cpp.draft_min", self.draft_min, 0)
        at_least("llama_cpp.threads", self.threads, 1, nullable=True)
        at_least("llama_cpp.ctx_size", self.ctx_size, 64)
        if not 0.0 <= float(self.draft_p_min) <= 1.0:
            raise ValueError(f"llama_cpp.draft_p_min={self.draft_p_min!r}: must be in [0, 1]")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"llama_cpp.port={self.port!r}: must be 0 (a free port) or a port number 1..65535")
        if not float(self.startup_timeout) > 0:
            raise ValueError(f"llama_cpp.startup_timeout={self.startup_timeout!r}: must be > 0 seconds")

    @property
    def draft_is_ngram(self) -> bool:
        return self.draft in NGRAM_TYPES

    @property
    def row_dtype(self) -> str:
        """The `dtype` key of llama.cpp's rows: the target's GGUF type."""
        return f"gguf:{self.target}"

    @property
    def row_draft(self) -> str:
        """The `draft` key of llama.cpp's speculative rows: the draft's GGUF type, or the n-gram type."""
        return self.draft if self.draft_is_ngram else f"gguf:{self.draft}"

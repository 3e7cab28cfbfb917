"""Find llama.cpp's binaries: `llama_cpp.bin_dir`, else $SPECBENCH_LLAMA_CPP_BIN, else the
cache directory `scripts/build_llama_cpp.sh` builds into, else PATH."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

TOOLS = ("llama-server", "llama-bench", "llama-quantize")
ENV = "SPECBENCH_LLAMA_CPP_BIN"
BUILD_HINT = "build them once with `bash scripts/build_llama_cpp.sh` (about 15-25 minutes on 2 cores)"


class LlamaCppMissing(FileNotFoundError):
    """A llama.cpp binary is not installed where specbench looks; the message says where it looked."""


def default_bin_dir() -> Path:
    """Where `scripts/build_llama_cpp.sh` installs the binaries: <specbench cache>/llama.cpp/bin."""
    from specbench.models.choices import default_cache_dir

    return default_cache_dir() / "llama.cpp" / "bin"


def find_tool(tool: str, bin_dir: str | None = None) -> Path:
    """The path of one llama.cpp tool (`TOOLS`), or `LlamaCppMissing` naming every place tried."""
    if tool not in TOOLS:
        raise ValueError(f"llama.cpp tool {tool!r}: must be one of {list(TOOLS)}")
    if bin_dir is not None:  # an explicit directory is the only place looked at
        path = Path(bin_dir) / tool
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise LlamaCppMissing(f"llama_cpp.bin_dir={bin_dir!r}: no executable {tool} there; {BUILD_HINT}")
    tried = []
    for where in (os.environ.get(ENV), str(default_bin_dir())):
        if where:
            path = Path(where) / tool
            if path.is_file() and os.access(path, os.X_OK):
                return path
            tried.append(str(path))
    found = shutil.which(tool)
    if found:
        return Path(found)
    raise LlamaCppMissing(f"{tool} not found (looked at ${ENV}, {', '.join(tried)} and PATH); {BUILD_HINT}")


def available(bin_dir: str | None = None) -> bool:
    """True when every tool in `TOOLS` is found (tests skip with the reason otherwise)."""
    try:
        for tool in TOOLS:
            find_tool(tool, bin_dir)
    except LlamaCppMissing:
        return False
    return True

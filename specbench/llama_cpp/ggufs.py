"""GGUF files for llama.cpp: the embedded SmolLM2 GGUF as it ships (Q4_1) and copies in other
types made once with `llama-quantize --allow-requantize` and cached beside the safetensors cache.

The copies hold the shipped Q4_1 weights in another format (F16 is exact; Q8_0 rounds them
again), so an F16 target and the Q4_1 draft are the same network at two precisions.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from specbench.llama_cpp import procs
from specbench.llama_cpp.binaries import find_tool
from specbench.llama_cpp.options import GGUF_TYPES as TYPES

SHIPPED = "Q4_1"  # the embedded GGUF's type


def check_type(field: str, value: str) -> None:
    """Raise naming the field when `value` is not a GGUF type specbench can make."""
    if value not in TYPES:
        raise ValueError(f"{field}={value!r}: must be one of {list(TYPES)} (GGUF types llama-quantize writes)")


def gguf_path(gguf_type: str, cache_dir: Path | None = None, bin_dir: str | None = None) -> Path:
    """The embedded model as a GGUF of `gguf_type`: the shipped file, or a cached requantized copy."""
    from specbench.models.loading import default_cache_dir, embedded_gguf

    check_type("llama_cpp gguf type", gguf_type)
    source = embedded_gguf()
    if gguf_type == SHIPPED:
        return source
    stat = source.stat()
    key = hashlib.sha1(f"{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    out = (cache_dir or default_cache_dir()) / "gguf" / f"{source.stem.rsplit('.', 1)[0]}.{gguf_type}-{key}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}-", suffix=".gguf")
    os.close(fd)
    cmd = [str(find_tool("llama-quantize", bin_dir)), "--allow-requantize", str(source), tmp, gguf_type]
    done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=procs.die_with_parent())
    if done.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"llama-quantize to {gguf_type} failed (exit {done.returncode}): {' | '.join(tail)}")
    os.replace(tmp, out)  # atomic: a killed quantization never leaves half a file under the cached name
    return out

"""What `forward.path=auto` runs on a job, and why: one decision on given inputs (`choose`).

`auto` is the fast path compiled wherever it runs: on CPU when inductor has a working C++ compiler
(`forward.compile_mode` as configured), on CUDA as CUDA graphs (`reduce-overhead`). Anywhere else, or for a
model the fast path refuses (`fast_path_refusal`), it is the eager reference, with the reason recorded.
An explicit `static` / `compiled` on a model the fast path refuses stops the job naming the reason.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

AUTO = "auto"
FAST_ATTENTION = ("sdpa", "eager")  # attention implementations StaticLM runs (it swaps in its grouped form)
CUDA_COMPILE_MODE = "reduce-overhead"  # CUDA graphs: a step is launch-bound there


@dataclass(frozen=True)
class ForwardChoice:
    path: str  # eager | static | compiled: what runs
    compile_mode: str
    reason: str  # why auto chose it ("" when the path was asked for by name)


def fast_path_refusal(model_config) -> str | None:
    """Why the fast path (StaticLM) cannot run a model with this config, or None when it can."""
    impl = getattr(model_config, "_attn_implementation", None)
    if impl not in FAST_ATTENTION:
        return f"model config _attn_implementation={impl!r}: the fast path needs one of {list(FAST_ATTENTION)}"
    return None


@functools.cache
def compiler_refusal() -> str | None:
    """Why inductor cannot compile CPU code here (no working C++ compiler), or None; tried once per process."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        cxx = get_cpp_compiler()  # the compiler inductor would run (CXX, or its config's default)
    except Exception as exc:  # noqa: BLE001 -- any failure to find one is the reason
        return f"inductor found no C++ compiler for its CPU code ({exc})"
    found = shutil.which(cxx)
    if found is None:
        return f"no C++ compiler {cxx!r} on PATH for inductor's CPU code (set CXX or install g++)"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.cpp")
        with open(src, "w", encoding="utf-8") as f:
            f.write("int main() { return 0; }\n")
        try:
            run = subprocess.run([found, src, "-o", os.path.join(tmp, "probe")], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"C++ compiler {found} failed to run ({exc})"
    if run.returncode != 0:
        return f"C++ compiler {found} cannot build a trivial program: {run.stderr.decode(errors='replace')[:200]}"
    return None


def choose(
    path: str, compile_mode: str, device: str, model_refusal: str | None, cpu_compiler_refusal: str | None
) -> ForwardChoice:
    """The path a job runs: `path` as asked, or for `auto` the compiled fast path where it is supported.
    `model_refusal`: `fast_path_refusal` of the pair's models (the first one found); `cpu_compiler_refusal`:
    `compiler_refusal()` (only read on CPU). ValueError when `static` / `compiled` is asked of a refused model."""
    if path != AUTO:
        if path != "eager" and model_refusal:
            raise ValueError(f"forward.path={path!r}: {model_refusal}; use forward=eager (or forward=auto)")
        return ForwardChoice(path, compile_mode, "")
    if model_refusal:
        return ForwardChoice("eager", compile_mode, f"auto: eager, {model_refusal}")
    kind = str(device).split(":")[0]
    if kind == "cuda":
        return ForwardChoice("compiled", CUDA_COMPILE_MODE, "auto: compiled, CUDA graphs on cuda")
    if kind == "cpu":
        if cpu_compiler_refusal:
            return ForwardChoice("eager", compile_mode, f"auto: eager, {cpu_compiler_refusal}")
        return ForwardChoice("compiled", compile_mode, "auto: compiled, inductor has a working C++ compiler")
    return ForwardChoice("eager", compile_mode, f"auto: eager, device {device!r}: the fast path runs on cpu and cuda")


def choose_for(path: str, compile_mode: str, device: str, *model_configs) -> ForwardChoice:
    """`choose` on this process: the models' refusals and, on CPU under auto, the compiler probe."""
    refusals = [r for c in model_configs if c is not None and (r := fast_path_refusal(c))]
    cpu = str(device).split(":")[0] == "cpu" and path == AUTO
    return choose(path, compile_mode, device, refusals[0] if refusals else None, compiler_refusal() if cpu else None)

"""llama.cpp's own component costs, from `llama-bench`: C_t(k) (the target processing k tokens
at the prompts' depth), C_t1 (one generated token) and the draft's cost per drafted token.

Raw rows only, one per timed repetition: role (target | draft), GGUF type, n_prompt, n_gen,
n_depth, threads and seconds. `TimingProfile.from_llama_bench` turns them into a timing profile.
"""

from __future__ import annotations

import json
import subprocess

import pandas as pd

from specbench.decoding.records import LLAMA_CT_COLUMNS
from specbench.llama_cpp import procs
from specbench.llama_cpp.binaries import find_tool
from specbench.llama_cpp.options import amx_repack_flags


def llama_bench(model: str, *, prompts: list[int], gen: int, depth: int, threads: int, reps: int, bin_dir=None) -> list:
    """Run llama-bench once (JSON output); returns its test records."""
    cmd = [str(find_tool("llama-bench", bin_dir)), "-m", str(model), "-t", str(threads), "-r", str(reps), "-o", "json"]
    cmd += ["-p", ",".join(map(str, prompts)) if prompts else "0", "-n", str(gen), "-d", str(depth)]
    cmd += amx_repack_flags("llama-bench")
    done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=procs.die_with_parent())
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"llama-bench failed (exit {done.returncode}) on {model}: {tail}")
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"llama-bench printed no JSON for {model}: {done.stdout[:200]!r}") from exc


def bench_costs(
    target: str,
    target_type: str,
    draft: str | None,
    draft_type: str,
    *,
    ks,
    depth: int,
    threads: int,
    reps: int = 5,
    gen: int = 16,
    bin_dir=None,
) -> pd.DataFrame:
    """C_t(k) for k in `ks` and C_t1 (tg) of the target, and the draft's pp k and tg, at `depth` context tokens."""
    rows = []
    jobs = [("target", target, target_type, list(ks))]
    if draft is not None:  # pp k of the draft: its catch-up on the committed tokens each round
        jobs.append(("draft", draft, draft_type, list(ks)))
    for role, model, gguf_type, prompts in jobs:
        for test in llama_bench(
            model, prompts=prompts, gen=gen, depth=depth, threads=threads, reps=reps, bin_dir=bin_dir
        ):
            for ns in test["samples_ns"]:
                rows.append(
                    [
                        role,
                        gguf_type,
                        int(test["n_prompt"]),
                        int(test["n_gen"]),
                        int(test["n_depth"]),
                        threads,
                        ns / 1e9,
                    ]
                )
    return pd.DataFrame(rows, columns=LLAMA_CT_COLUMNS)

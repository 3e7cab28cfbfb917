"""Each form of `specbench::cache_attention` (avx2, avx512_bf16, amx_bf16) on the embedded pair's attention shape (bf16,
9 query heads over 3 key/value heads, d 64), hot, in one process, alternated round by round; with `--old`, also the
one-query kernel as commit c341841 had it (`one_query_attention`, k = 1 only), built from git beside the current one.

    python analysis/fast_path_verify_attention_cpu_amx/forms.py [--threads 2] [--rounds 15] [--calls 400] [--old]
"""

import argparse
import statistics
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from specbench.bench.envinfo import hardware_label
from specbench.models import cpu_matvec

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--rounds", type=int, default=15)
ap.add_argument("--calls", type=int, default=400)
ap.add_argument("--old", action="store_true", help="also c341841's one-query kernel at k = 1")
args = ap.parse_args()
torch.set_num_threads(args.threads)
assert cpu_matvec.available()
forms = {}  # name -> isa, the forms this machine runs
for isa, name in cpu_matvec.ATTENTION_FORMS.items():
    try:
        cpu_matvec.attention_form(isa)
        forms[name] = isa
    except RuntimeError:
        pass
if args.old:  # the old source, and the two CPU checks it took from cpu_bf16.cpp
    tmp = Path(tempfile.mkdtemp())
    old = subprocess.run(
        ["git", "show", "c341841:specbench/models/cpu_attention.cpp"], capture_output=True, text=True, check=True
    ).stdout
    (tmp / "old.cpp").write_text(old)
    (tmp / "checks.cpp").write_text(
        "#include <cstdlib>\n#include <string>\n"
        'bool specbench_aten_allows_avx512() { const char* l = std::getenv("ATEN_CPU_CAPABILITY");'
        ' return !l || !*l || std::string(l).rfind("avx512", 0) == 0; }\n'
        'bool specbench_cpu_has_avx512_bf16() { return __builtin_cpu_supports("avx512bf16"); }\n'
    )
    load(
        "specbench_old_attention",
        [str(tmp / "old.cpp"), str(tmp / "checks.cpp")],
        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
        build_directory=str(tmp),
        is_python_module=False,
    )


def timed(fn) -> float:
    t = time.perf_counter()
    for _ in range(args.calls):
        fn()
    return (time.perf_counter() - t) / args.calls * 1e6


print(f"{hardware_label('cpu')}, {args.threads} threads, bf16, H 9 over G 3, d 64, {args.rounds} rounds x {args.calls}")
for k in (1, 5, 16):
    for c in (320, 640):
        q = torch.randn(1, 9, k, 64).bfloat16()
        key, value = (torch.randn(1, 3, c + 100, 64).bfloat16()[:, :, :c] for _ in range(2))  # cache views
        mask = torch.zeros(1, 1, k, c)
        mask[0, 0, :, c - 40 :] = torch.finfo(torch.float32).min
        runs = {
            name: partial(cpu_matvec.cache_attention, q, key, value, mask, 0.125, isa) for name, isa in forms.items()
        }
        if args.old and k == 1:
            runs["old one_query (c341841)"] = partial(
                torch.ops.specbench.one_query_attention, q, key, value, mask, 0.125
            )
        times = {name: [] for name in runs}
        for fn in runs.values():
            fn()
        for r in range(args.rounds):
            for name in runs if r % 2 == 0 else reversed(list(runs)):
                times[name].append(timed(runs[name]))
        line = ", ".join(
            f"{name} {statistics.median(ts):.1f} [{sorted(ts)[len(ts) // 4]:.1f}, {sorted(ts)[3 * len(ts) // 4]:.1f}]"
            for name, ts in times.items()
        )
        print(f"k {k:2d}, C {c}: {line} us (median [quartiles])", flush=True)

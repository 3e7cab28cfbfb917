"""Per prompt and engine, decoding speed at 2 threads over 1 thread, from a `+sweep=engines threads=1,2` run (two
jobs, one after the other: not interleaved between thread counts, so the ratios carry the box's drift between them).

    python analysis/fast_path_threads_cpu_amx/engines_threads.py runs/engines_threads_amx
"""

import sys

from specbench.analysis.stats import median_ci
from specbench.bench.runstore import load_sweep

requests = load_sweep(sys.argv[1], "requests")
requests["threads"] = requests["job"].str.extract(r"threads=(\d+)")[0].astype(int)
requests["tok_s"] = requests["new_tokens"] / requests["wall_time"]
speed = requests.groupby(["decoder", "threads", "prompt_id"])["tok_s"].median().unstack("threads")
print("decoder: tok/s at 1 and 2 threads (median over prompts); 2 / 1 threads per prompt: median [exact 95% CI], n")
for decoder, per_prompt in speed.groupby(level="decoder"):
    ratio = (per_prompt[2] / per_prompt[1]).dropna()
    mid, low, high = median_ci(ratio.to_numpy())
    print(
        f"{decoder}: {per_prompt[1].median():.1f} -> {per_prompt[2].median():.1f} tok/s; "
        f"{mid:.2f}x [{low:.2f}, {high:.2f}], n = {len(ratio)}"
    )

print("\nper thread count, engine / engine per prompt: median [exact 95% CI] (the report's engines table pairs the rest)")
for threads in (1, 2):
    at = speed.xs(threads, axis=1).unstack("decoder")
    for a, b in (("speculative", "llama_cpp"), ("speculative", "llama_cpp_autoregressive")):
        mid, low, high = median_ci((at[a] / at[b]).dropna().to_numpy())
        print(f"{threads} thread(s): {a} / {b}: {mid:.2f}x [{low:.2f}, {high:.2f}]")

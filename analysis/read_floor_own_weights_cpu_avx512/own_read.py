"""The job's floor probes beside the read of the embedded pair's own weights where they lie, in one process: a
fresh 256 MiB buffer (`read`, the hardware limit a report has used) against the target's bf16 weights
(`read_target`) and the W8A16 draft's (`read_draft`), 2 threads, 7 repeats each, the probes taking turns.

    python analysis/read_floor_own_weights_cpu_avx512/own_read.py   # one process; run it in several

Prints min / median / max GB/s per probe.
"""

import statistics

import torch

from specbench.bench.microbench import bench_weight_stream, streamed_weights
from specbench.config import DraftConfig, PairConfig
from specbench.models.pair import load_pair

torch.set_num_threads(2)
pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="w8a16"))
own = {"target": streamed_weights(pair.target), "draft": streamed_weights(pair.draft_model)}
rows = bench_weight_stream(torch.bfloat16, "cpu", weights=own)
rates: dict[str, list[float]] = {}
for r in rows:
    rates.setdefault(r["probe"], []).append(r["probe_bytes"] / r["t_stream"] / 1e9)
print({p: (round(min(v), 1), round(statistics.median(v), 1), round(max(v), 1)) for p, v in rates.items()})

"""Do the target's weights read slower where they lie than the same bytes packed into one fresh allocation? In one
process, 2 threads, three rounds of 9 reads each (best and median GB/s): `own` reads the target's streamed tensors
in place (`cpu_bf16.stream_read`, as the job's `read_target` probe); `arena` one fresh allocation holding a copy of
them end to end; `arena-views` the same arena through one view per tensor (the spans a step would read); `buffer` a
fresh float32 buffer of the same size (the job's `read` probe kind).

    python analysis/read_floor_own_weights_cpu_avx512/arena.py   # one process; run it in several
"""

import statistics
import time

import torch

from specbench.bench.microbench import streamed_weights
from specbench.config import DraftConfig, PairConfig
from specbench.models import cpu_bf16
from specbench.models.pair import load_pair

torch.set_num_threads(2)
pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="w8a16"))
weights = streamed_weights(pair.target)
nbytes = sum(t.numel() * t.element_size() for t in weights)
arena = torch.empty(nbytes, dtype=torch.uint8)
views, at = [], 0
for t in weights:
    n = t.numel() * t.element_size()
    arena[at : at + n].copy_(t.contiguous().view(-1).view(torch.uint8))
    views.append(arena[at : at + n])
    at += n
buffer = torch.empty(nbytes // 4, dtype=torch.float32).uniform_()


def rate(read) -> str:
    read()
    seconds = []
    for _ in range(9):
        start = time.perf_counter()
        read()
        seconds.append(time.perf_counter() - start)
    return f"{nbytes / min(seconds) / 1e9:.1f} / {nbytes / statistics.median(seconds) / 1e9:.1f}"


for _ in range(3):
    print(
        "GB/s best / median:",
        f"own {rate(lambda: cpu_bf16.stream_read(weights))},",
        f"arena {rate(lambda: cpu_bf16.stream_read([arena]))},",
        f"arena-views {rate(lambda: cpu_bf16.stream_read(views))},",
        f"buffer {rate(lambda: cpu_bf16.stream_read([buffer]))}",
    )

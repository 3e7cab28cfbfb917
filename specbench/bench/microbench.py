"""Per-job micro-benchmarks: C_t(k), and the weight-streaming bandwidth behind the hardware floor.

Verification cost is flat in k while the forward is memory-bound and rises once it is
compute-bound, so the cost model fits a monotone curve to these points rather than
guessing C_t(γ+1) from a line. Each forward is rolled back, so the context stays fixed.

A decode step must read every weight once, so (weight bytes ÷ streaming bandwidth) is the
floor under C_t1 and under a draft step: at the best read bandwidth measured (the hardware
limit), and at the rate of the one-row linear a library runs (what that kernel could reach).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import torch
from torch import nn
from transformers import PreTrainedModel

from specbench.decoding.kvcache import CachedLM
from specbench.decoding.static_kv import StaticLM
from specbench.decoding.timing import PhaseTimer
from specbench.models import cpu_bf16
from specbench.models.kernels import aten_gemv

CT_COLUMNS = ["batch_size", "k", "context_len", "repeat", "t_forward"]
FLOOR_COLUMNS = ["probe", "probe_bytes", "repeat", "t_stream", "threads", "target_weight_bytes", "draft_weight_bytes"]


def bench_target_forward(
    target: PreTrainedModel,
    batch_size: int,
    ks: list[int] | range = range(1, 17),
    context_len: int = 128,
    repeats: int = 3,
    seed: int = 0,
    lm: CachedLM | StaticLM | None = None,
) -> list[dict]:
    """Rows (batch_size, k, context_len, repeat, t_forward seconds) over a random context.

    `lm`: the job's LM object for `target` (its forward path); None: the eager reference."""
    g = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    context = torch.randint(0, vocab, (batch_size, context_len), generator=g).tolist()
    lm = lm if lm is not None else CachedLM(target)
    lm.prefill(context)
    timer = PhaseTimer(target.device)
    warm = torch.randint(0, vocab, (batch_size, 1), generator=g).to(target.device)
    lm.feed(warm)  # first forward pays one-off costs; not recorded
    lm.keep_last_fed(1, [0] * batch_size)
    marks = []
    for repeat in range(repeats):
        for k in ks:
            tokens = torch.randint(0, vocab, (batch_size, k), generator=g).to(target.device)
            start = timer.mark()
            lm.feed(tokens)
            end = timer.mark()
            lm.keep_last_fed(k, [0] * batch_size)  # roll back: the context stays fixed
            marks.append((repeat, k, start, end))
    seconds = timer.resolve()
    return [
        {
            "batch_size": batch_size,
            "k": k,
            "context_len": context_len,
            "repeat": r,
            "t_forward": seconds[e] - seconds[s],
        }
        for r, k, s, e in marks
    ]


def streamed_weights(model: nn.Module | None) -> list[torch.Tensor]:
    """The tensors one decode step reads: every parameter and buffer once (tied tensors once), except an input
    embedding that is not also the output head (a lookup reads one row per token). Empty for no model (n-gram
    lookup)."""
    if model is None:
        return []
    tensors = {t.data_ptr(): t for t in itertools.chain(model.parameters(), model.buffers())}
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    head_weight = getattr(head, "weight", None)  # a quantized head (Int4Linear) has no float weight
    if emb is not None and (head_weight is None or head_weight.data_ptr() != emb.weight.data_ptr()):
        tensors.pop(emb.weight.data_ptr(), None)
    return list(tensors.values())


def tensor_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """The tensors' bytes together."""
    return int(sum(t.numel() * t.element_size() for t in tensors))


def streamed_weight_bytes(model: nn.Module | None) -> int:
    """Bytes of the weights one decode step reads (`streamed_weights`); 0 for no model (n-gram lookup)."""
    return tensor_bytes(streamed_weights(model))


def bench_weight_stream(
    dtype: torch.dtype,
    device: torch.device | str,
    probe_bytes: int | None = None,
    repeats: int = 7,
    hidden: int = 2048,
    weights: Mapping[str, Sequence[torch.Tensor]] | None = None,
) -> list[dict]:
    """Rows (probe, probe_bytes, repeat, t_stream seconds, threads) over a `probe_bytes` matrix (256 MiB on
    CPU, 1 GiB on CUDA: far past the last-level cache), the probes taking turns each repeat so a busy
    neighbour hits them alike. Probes: `matvec`, one [1, hidden] x [hidden, N] linear in `dtype` through
    the library (torch's one-row kernel); `read`, a sum over the same bytes (how fast this machine reads them
    at all: no kernel can do better; on CPU specbench's own wide-load sum split across all of torch's threads,
    `cpu_bf16.stream_sum`, elsewhere torch's sum); and on CPU in bf16 with specbench's kernels built, `kernel`,
    the same linear through specbench's bf16 kernel (`cpu_bf16.bf16_matvec`). On CPU with the kernels built, per
    entry of `weights` (name -> a model's `streamed_weights`), `read_<name>`: the same read over those tensors
    where they lie (`cpu_bf16.stream_read`; its probe_bytes their bytes; tensors off the CPU or not contiguous are
    left out, and the rate read from the rest stands for them). A buffer's pages can read at another
    rate than the model's (analysis/read_floor_own_weights_cpu_avx512/): this is the floor of that model's step."""
    device = torch.device(device)
    probe_bytes = probe_bytes or (1 << 30 if device.type == "cuda" else 256 << 20)
    element = torch.empty((), dtype=dtype).element_size()
    weight = torch.empty(probe_bytes // (element * hidden), hidden, dtype=dtype, device=device).uniform_(-1, 1)
    x = torch.ones(1, hidden, dtype=dtype, device=device)
    flat = weight.view(-1).view(torch.float32) if (weight.numel() * element) % 4 == 0 else weight.view(-1)
    # bf16 on CPU: ATen's gemv, the kernel a tuned CpuLinear runs at one row (torch's default reorders
    # the weight on every call and streamed at about half that rate here).
    linear = aten_gemv if (dtype == torch.bfloat16 and device.type == "cpu") else nn.functional.linear
    own = device.type == "cpu" and cpu_bf16.available()
    probes = {
        "matvec": lambda: linear(x, weight),
        "read": (lambda: cpu_bf16.stream_sum(flat)) if own and flat.dtype == torch.float32 else (lambda: flat.sum()),
    }
    if own and dtype == torch.bfloat16:
        probes["kernel"] = lambda: cpu_bf16.bf16_matvec(x, weight)
    nbytes = dict.fromkeys(probes, weight.numel() * element)
    for name, tensors in (weights or {}).items() if own else ():
        tensors = [t for t in tensors if t.device.type == "cpu" and t.is_contiguous()]
        if tensors:
            probes[f"read_{name}"] = lambda tensors=tensors: cpu_bf16.stream_read(tensors)
            nbytes[f"read_{name}"] = sum(t.numel() * t.element_size() // 4 * 4 for t in tensors)
    timer = PhaseTimer(device)
    for run in probes.values():
        run()  # first call pays one-off costs; not recorded
    marks = []
    for repeat in range(repeats):
        for probe, run in probes.items():
            start = timer.mark()
            run()
            marks.append((probe, repeat, start, timer.mark()))
    seconds = timer.resolve()
    threads = torch.get_num_threads()
    rows = [
        {"probe": p, "probe_bytes": nbytes[p], "repeat": r, "t_stream": seconds[e] - seconds[s], "threads": threads}
        for p, r, s, e in marks
    ]
    return sorted(rows, key=lambda row: (list(probes).index(row["probe"]), row["repeat"]))

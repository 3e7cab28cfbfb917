"""Weight-only int8 (W8A16) and int4 (W4A16) copies of a model: self-drafts of the target.

W8A16: each nn.Linear becomes int8 weights with one scale per output channel; on CPU with bf16
activations the matmul runs in torch's int8 weight kernel, so the copy reads half the bytes of
the bf16 target. W4A16: 4-bit weights with a scale and zero point per group of `group` input
channels (128 by default, as GPTQ/AWQ checkpoints; 32 is the embedded target's own Q4_1 grid, on which the
copy reproduces the target's weights: docs/engines.md), in torch's CPU int4 kernel: a quarter of the bytes.
Where in_features is not a multiple of the group (SmolLM2's 576 at 128) the last group is shorter, as GPTQ's. W4A16 with an int8 head (`head="int8"`):
the output head is where int4's rounding costs agreement with the target (SmolLM2-135M, teacher-forced
greedy agreement over 16 Spec-Bench prompts, scripts/draft_agreement.py: int4 everywhere 90.7%, int8
head 97.2%, W8A16 95.7%), and it is a fifth of the weights. Activations stay in the model's float dtype in all.
With float32 activations the few-row kernel is specbench's own (`cpu_matvec`, AVX2) where it is built: torch
has no int8 kernel for fp32 and its int4 kernel is compute-bound on AVX2.
"""

from __future__ import annotations

import copy
import functools
import math
import time

import torch
from torch import nn

from specbench.models import choices, cpu_matvec
from specbench.models.int4_groups import DEFAULT_INT4_GROUP, INT4_GROUPS
from specbench.models.kernels import PROBE_ROWS
from specbench.models.vocab import SubsetHead, restrict_head

TORCH_KERNEL_DTYPES = {"int8": (torch.bfloat16,), "int4": (torch.bfloat16, torch.float16, torch.float32)}
# specbench's CPU kernels (`cpu_matvec`) and the activation dtypes they take: float32 on CPUs with AVX2, and int8 with
# bf16 too (it streamed a bf16 W8A16 draft twice as fast as torch's `_weight_int8pack_mm` on the AVX-512 EPYC,
# docs/kernels.md). Where both apply, specbench's runs.
SPECBENCH_KERNEL_DTYPES = {"int8": (torch.float32, torch.bfloat16), "int4": (torch.float32,)}
# CUDA: torch's weight-only ops (tinygemm for int4) and the activation dtypes they take. Without one, a layer would
# dequantize its whole weight on every call and cost more than the bf16 target it drafts for: such a kind is refused.
CUDA_KERNELS = {
    "int8": ("_weight_int8pack_mm", (torch.bfloat16, torch.float16)),
    "int4": ("_weight_int4pack_mm", (torch.bfloat16,)),
}
CUDA_KERNEL_ROWS = 256  # on CUDA the kernel runs up to this many rows (decode steps and verifies), the GEMM past it
INT4_INNER_K_TILES = 8  # tinygemm's packing: in_features must be a multiple of 16 x this


def cuda_kernel_missing(kind: str, dtype: torch.dtype) -> str | None:
    """Why this torch has no CUDA kernel for weight-only `kind` with `dtype` activations; None when it has one."""
    op, dtypes = CUDA_KERNELS[kind]
    if dtype not in dtypes:
        return f"torch's CUDA {kind} kernel ({op}) takes {[str(d).removeprefix('torch.') for d in dtypes]} activations, not {str(dtype).removeprefix('torch.')}"
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "CUDA"):
        return f"torch {torch.__version__} has no CUDA kernel for aten::{op}"
    return None


def kernel_source(kind: str, dtype: torch.dtype, device: torch.device | str = "cpu") -> str | None:
    """Whose weight-only `kind` kernel runs for activations in `dtype`: 'specbench' (`cpu_matvec`, for
    `SPECBENCH_KERNEL_DTYPES`), 'torch' (its CPU kernels, or its CUDA ones where `cuda_kernel_missing` finds
    them), or None where neither applies (the layer dequantizes)."""
    kind_of_device = torch.device(device).type
    if kind_of_device == "cuda":
        return None if cuda_kernel_missing(kind, dtype) else "torch"
    if kind_of_device != "cpu":
        return None
    if dtype in SPECBENCH_KERNEL_DTYPES[kind] and cpu_matvec.available():
        return "specbench"
    return "torch" if dtype in TORCH_KERNEL_DTYPES[kind] else None


def pack_int4_for_cuda(q: torch.Tensor) -> torch.Tensor:
    """q [n, k] in 0..15 -> tinygemm's layout (`_convert_weight_to_int4pack`): two nibbles a byte, even column high."""
    q = q.to(torch.uint8)
    return torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4) | q[:, 1::2], INT4_INNER_K_TILES)


def _median_time(run, x: torch.Tensor) -> float:
    """Median of 3 calls after a warm-up (1 call when the warm-up alone took over 50 ms)."""
    start = time.perf_counter()
    run(x)
    if time.perf_counter() - start > 0.05:
        start = time.perf_counter()
        run(x)
        return time.perf_counter() - start
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        run(x)
        samples.append(time.perf_counter() - start)
    return sorted(samples)[1]


@functools.cache
def kernel_rows(
    kind: str, out_features: int, in_features: int, dtype: torch.dtype, device: torch.device, group: int = 0
) -> int:
    """The most rows (of `PROBE_ROWS`) up to which the weight-only `kind` kernel (`kernel_source`) beats a dequantized
    GEMM at this shape and dtype on this machine; 0 where it never does, or does not apply (not CPU,
    another dtype). Timed once per machine and software version (`choices.cached`: later processes read
    the answer) by `time_kernel_rows`, decided by `pick_kernel_rows`."""
    source = kernel_source(kind, dtype, device)
    if source is None:
        return 0
    grouped = f" g{group}" if group else ""  # int4's group size (0: int8, per output channel)
    name = (
        f"kernel_rows {kind}{grouped} {out_features}x{in_features} {str(dtype).removeprefix('torch.')} source={source}"
    )
    timings = functools.partial(time_kernel_rows, kind, out_features, in_features, dtype, group)
    return choices.cached(name, timings, pick_kernel_rows)[0]


def time_kernel_rows(kind: str, out_features: int, in_features: int, dtype: torch.dtype, group: int = 0) -> dict:
    """{rows: {"kernel": s, "gemm": s}} up to the first row count where the kernel loses. A GEMM's cost does
    not fall as rows grow, so while a kernel takes under half the last GEMM time that GEMM time stands in."""
    linear = nn.Linear(in_features, out_features, bias=False, dtype=dtype)
    layer = weight_only_layer(kind, linear, group, probe=False)
    timings, gemm = {}, 0.0
    with torch.inference_mode():
        for rows in PROBE_ROWS:
            x = torch.randn(rows, in_features, dtype=dtype)
            kernel = _median_time(layer.kernel, x)
            if kernel >= gemm / 2:
                gemm = _median_time(layer.gemm, x)
            timings[str(rows)] = {"kernel": kernel, "gemm": gemm}
            if kernel > gemm:
                break
    return timings


def pick_kernel_rows(timings: dict) -> int:
    """The rule: the most rows up to which the kernel took no longer than the GEMM, counting up from the
    fewest rows of `{rows: {"kernel": s, "gemm": s}}`; 0 where it never did."""
    best = 0
    for rows, t in sorted((int(rows), t) for rows, t in timings.items()):
        if t["kernel"] > t["gemm"]:
            break
        best = rows
    return best


class WeightOnlyLinear(nn.Module):
    """What Int8Linear and Int4Linear share: per call, their few-row kernel or one dequantized GEMM.

    The kernel wins while memory-bound (few rows: decode steps); past some rows (prefill, big batches, long
    verifies) the GEMM is faster, its cost not growing with the rows. Where, depends on shape and ISA."""

    KIND = ""  # the weight format, a key of WEIGHT_ONLY_LAYERS
    in_features: int
    out_features: int
    bias: nn.Parameter | None

    @property
    def activation_dtype(self) -> torch.dtype:
        """The float dtype the layer was quantized from: the only one its kernel takes."""
        raise NotImplementedError

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def gemm(self, flat: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _pick_kernel(self, device: torch.device, probe: bool) -> None:
        """Set `source` (whose kernel, `kernel_source`) and `kernel_rows` (measured when `probe`, else every row)."""
        dtype = self.activation_dtype
        self.source = kernel_source(self.KIND, dtype, device)
        if torch.device(device).type == "cuda":
            self.kernel_rows = CUDA_KERNEL_ROWS if self.source else 0
        elif probe:
            group = getattr(self, "group", 0)
            self.kernel_rows = kernel_rows(self.KIND, self.out_features, self.in_features, dtype, device, group)
        else:
            self.kernel_rows = max(PROBE_ROWS) if self.source else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if flat.dtype == self.activation_dtype and flat.shape[0] <= self.kernel_rows:  # kernel_rows: 0 without one
            y = self.kernel(flat)
        else:
            y = self.gemm(flat)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


class Int8Linear(WeightOnlyLinear):
    """y = x @ (w_int8 * scale).T (+ bias), per-output-channel symmetric scales."""

    KIND = "int8"

    def __init__(self, linear: nn.Linear, probe: bool = True) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0  # [out]
        self.register_buffer("weight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._pick_kernel(linear.weight.device, probe)

    @property
    def activation_dtype(self) -> torch.dtype:
        return self.scale.dtype

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        if self.source == "specbench":
            return cpu_matvec.int8_matvec(flat.contiguous(), self.weight, self.scale)
        return torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scale)

    def gemm(self, flat: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(flat, self.weight.to(flat.dtype)) * self.scale.to(flat.dtype)


class Int4Linear(WeightOnlyLinear):
    """y = x @ w4.T (+ bias): w = (q − 8)·scale + zero per group of `group` input channels, q in 0..15; a last group
    shorter where in_features is not a multiple of `group` (channel c is in group c // group, as GPTQ's g_idx)."""

    KIND = "int4"

    def __init__(self, linear: nn.Linear, probe: bool = True, group: int = DEFAULT_INT4_GROUP) -> None:
        super().__init__()
        n, k = linear.out_features, linear.in_features
        if group not in INT4_GROUPS:
            raise ValueError(f"Int4Linear: group={group!r}: must be one of {list(INT4_GROUPS)}")
        if k % INT4_GROUPS[0]:
            raise ValueError(f"Int4Linear: in_features={k} is not a multiple of {INT4_GROUPS[0]}")
        self.group = group
        # torch's kernels take one group size dividing in_features: the groups' (scale, zero) are repeated per
        # `kernel_group` channels (576 at 128: per 64), the same weights
        self.kernel_group = math.gcd(group, k)
        q, scale, low = int4_quantize(linear.weight.detach(), group)
        # The GEMM path's copy of q, a plain attribute rather than a buffer: a decode step (the kernel)
        # never reads it, so it is not part of the weight bytes a step streams.
        self.unpacked = q.to(torch.uint8)
        # [k/kernel_group, n, 2]: (scale, zero) as torch's kernel takes them; zero = low + 8·scale since q is offset by 8
        repeat = group // self.kernel_group
        sz = torch.stack([scale, low + 8 * scale], -1).repeat_interleave(repeat, 1)[:, : k // self.kernel_group]
        sz = sz.transpose(0, 1).contiguous().to(linear.weight.dtype)
        self.in_features, self.out_features = k, n
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        device = linear.weight.device
        source = kernel_source(self.KIND, sz.dtype, device)
        if source == "specbench":
            # its buffers: what its kernel streams (w = q·scale + low per group, one of each per `group` channels)
            self.register_buffer("nibbles", cpu_matvec.pack_nibbles(self.unpacked))
            self.register_buffer("group_scale", scale.contiguous())
            self.register_buffer("group_low", low.contiguous())
            self.scales_zeros = sz  # the GEMM path's, like `unpacked`
        elif device.type == "cuda":
            if source == "torch":
                self.register_buffer("packed", pack_int4_for_cuda(self.unpacked))
            self.register_buffer("scales_zeros", sz)
        else:
            self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1))
            self.register_buffer("scales_zeros", sz)  # the activations' dtype: no cast per call
        self._pick_kernel(linear.weight.device, probe)

    @property
    def activation_dtype(self) -> torch.dtype:
        return self.scales_zeros.dtype

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight [out, in] the kernel multiplies by, in `dtype`."""
        n, k, g = self.out_features, self.in_features, self.kernel_group
        sz = self.scales_zeros.transpose(0, 1)  # [n, k/g, 2]
        w = (self.unpacked.reshape(n, k // g, g).float() - 8) * sz[..., :1] + sz[..., 1:]
        return w.reshape(n, k).to(dtype)

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        if self.source == "specbench":
            return cpu_matvec.int4_matvec(flat.contiguous(), self.nibbles, self.group_scale, self.group_low)
        sz = self.scales_zeros.to(flat.dtype)
        if flat.device.type == "cuda":
            return torch.ops.aten._weight_int4pack_mm(flat.contiguous(), self.packed, self.kernel_group, sz)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(flat.contiguous(), self.packed, self.kernel_group, sz)

    def gemm(self, flat: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(flat, self.dequantized(flat.dtype))


def int4_quantize(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Min/max int4 of weight [n, k] per `group` input channels (the last group shorter where k is not a multiple):
    q [n, k] float in 0..15, scale and low [n, ceil(k / group)] float32; w ≈ q·scale + low per group."""
    w = weight.float()
    k = w.shape[1]
    low, high = _group_reduce(w, group, torch.amin), _group_reduce(w, group, torch.amax)
    scale = ((high - low) / 15).clamp_min(1e-8)
    per_channel = functools.partial(torch.repeat_interleave, repeats=group, dim=1)
    q = torch.round((w - per_channel(low)[:, :k]) / per_channel(scale)[:, :k]).clamp(0, 15)
    return q, scale, low


def _group_reduce(w: torch.Tensor, group: int, reduce) -> torch.Tensor:
    """reduce(w [n, k]) over each group of `group` columns (the last one may be shorter) -> [n, ceil(k / group)]."""
    n, k = w.shape
    full = k // group * group
    parts = [reduce(w[:, :full].reshape(n, -1, group), -1)] if full else []
    if full < k:
        parts.append(reduce(w[:, full:], -1, keepdim=True))
    return torch.cat(parts, 1)


def weight_only_layer(kind: str, linear: nn.Linear, group: int, probe: bool = True) -> WeightOnlyLinear:
    """`linear` in weight format `kind` ('int8' | 'int4'); `group` is int4's group size (int8 has none)."""
    if kind == Int4Linear.KIND:
        return Int4Linear(linear, probe, group)
    return WEIGHT_ONLY_LAYERS[kind](linear, probe)


WEIGHT_ONLY_LAYERS: dict[str, type[WeightOnlyLinear]] = {cls.KIND: cls for cls in (Int8Linear, Int4Linear)}


def _quantize(model: nn.Module, body: str, head: str, vocab: tuple[int, ...] | None, group: int = 0) -> nn.Module:
    """A deep copy of `model` with the output head's linear in format `head` and every other nn.Linear in `body`
    (int4 layers in groups of `group`)."""
    quantized = copy.deepcopy(model)
    if vocab is not None:
        restrict_head(quantized, vocab)  # before quantizing: each output row is quantized on its own
    out = quantized.get_output_embeddings()
    head_linear = out.linear if isinstance(out, SubsetHead) else out
    for _name, module in list(quantized.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, weight_only_layer(head if child is head_linear else body, child, group))
    quantized.eval()
    return quantized


def quantize_w8a16(model: nn.Module, vocab: tuple[int, ...] | None = None) -> nn.Module:
    """A deep copy of `model` with every nn.Linear (lm_head included) in W8A16; with `vocab`, its head
    scores only those ids (`specbench.models.vocab`)."""
    return _quantize(model, "int8", "int8", vocab)


def quantize_w4a16(
    model: nn.Module, vocab: tuple[int, ...] | None = None, head: str = "int4", group: int = DEFAULT_INT4_GROUP
) -> nn.Module:
    """A deep copy of `model` with every nn.Linear in W4A16 (groups of `group` input channels), the output head
    in format `head` ('int4' | 'int8'); `vocab` as for `quantize_w8a16`."""
    if head not in WEIGHT_ONLY_LAYERS:
        raise ValueError(f"head={head!r}: must be one of {sorted(WEIGHT_ONLY_LAYERS)}")
    quantized = _quantize(model, "int4", head, vocab, group)
    quantized.config.specbench_concat_linears = True  # the fast path fuses q/k/v and gate/up (`static_kv`)
    return quantized


@functools.lru_cache(maxsize=2)
def quantize_w8a16_cached(model: nn.Module, vocab: tuple[int, ...] | None = None) -> nn.Module:
    """`quantize_w8a16`, once per loaded model and vocabulary per process (a sweep's jobs share the copy)."""
    return quantize_w8a16(model, vocab)


@functools.lru_cache(maxsize=4)
def quantize_w4a16_cached(
    model: nn.Module, vocab: tuple[int, ...] | None = None, head: str = "int4", group: int = DEFAULT_INT4_GROUP
) -> nn.Module:
    """`quantize_w4a16`, once per loaded model, vocabulary, head format and group size per process."""
    return quantize_w4a16(model, vocab, head, group)


def kernel_choices(model: nn.Module) -> dict[str, int]:
    """Per quantized weight shape, the rows up to which its layers use their kernel (for job records)."""
    return {f"{_format(m)} {m.out_features}x{m.in_features}": m.kernel_rows for m in _weight_only(model)}


def kernel_sources(model: nn.Module) -> dict[str, str | None]:
    """Per weight format in `model`, whose kernel its layers run: 'specbench', 'torch' or None (for job records)."""
    return {m.KIND: m.source for m in _weight_only(model)}


def _format(layer: WeightOnlyLinear) -> str:
    """'int8', or 'int4 g<group>'."""
    return f"{layer.KIND} g{layer.group}" if isinstance(layer, Int4Linear) else layer.KIND


def _weight_only(model: nn.Module) -> list[WeightOnlyLinear]:
    return [m for m in model.modules() if isinstance(m, WeightOnlyLinear)]

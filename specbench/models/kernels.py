"""bf16 linears on CPU in the kernel that is fastest for their shape and row count on this machine.

torch runs a bf16 `nn.Linear` on CPU through oneDNN, which reorders the weight on every call. At a
decode step's one row that streamed 7 GB/s on the AVX-512 EPYC here; ATen's own gemv (oneDNN off)
streamed 15 GB/s, and oneDNN with the weight reordered once (prepacked) 12 GB/s. Past a row or two
ATen's gemv falls far behind, while the prepacked kernel's time stays nearly flat from 4 rows to 16
(so a verify forward of γ + 1 costs little more than one row). Its result equals torch's default bit
for bit; the gemv's can differ in the last bf16 bit (a different summation order). `CpuLinear` keeps
the weight and a prepacked copy, and takes the gemv up to the rows where it was measured faster for
its shape. At the row counts where specbench's own bf16 kernel (`cpu_bf16.cpp`: each weight streamed once across all
threads) was measured not slower than both (`own_counts`, up to `cpu_bf16.MAX_ROWS`) it takes that kernel;
that kernel is an op `torch.compile` calls too, so the compiled fast path runs it in place of inductor's GEMM.
"""

from __future__ import annotations

import functools
import itertools
import os
import time

import torch
from torch import nn

from specbench.models import choices, cpu_bf16

PROBE_ROWS = (1, 2, 4, 8, 16, 32, 64)  # rows at which two kernels of one layer are timed (here and in quant)
PROBE_BYTES = 48 << 20  # weight copies per probed shape: past the last-level cache
MAX_COPIES = 512  # of one small shape in a probe
NEAR_TIE = 0.9  # a measured alternative replaces the default only when it takes under this share of its time


def clearly_faster(seconds: float, default_seconds: float) -> bool:
    """Whether a timing beats the default's by more than a near-tie (`NEAR_TIE`): the one rule both probes
    (`CpuLinear`'s gemv rows, `dtype=auto`) use, so a within-noise difference never flips a choice."""
    return seconds < NEAR_TIE * default_seconds


MAX_MEMORY_SHARE = 0.25  # the prepacked copies may take at most this share of the machine's memory


def interleaved_medians(runs: dict, repeats: int = 5) -> dict[str, float]:
    """Median seconds of each callable, timed in turn `repeats` times after one warm-up call each, so
    drift and a busy neighbour core hit them alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(repeats + 1):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            if i:
                times[name].append(time.perf_counter() - start)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


@functools.cache
def prepack_supported() -> bool:
    """oneDNN's bf16 prepacked linear needs avx512bw/vl/dq (or avx_ne_convert); elsewhere it refuses."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), 1)
    except (RuntimeError, AttributeError):
        return False
    return True


def aten_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` with oneDNN switched off for this call: ATen's own bf16 kernel."""
    previous = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        return nn.functional.linear(x, weight, bias)
    finally:
        torch._C._set_mkldnn_enabled(previous)


@functools.cache
def gemv_rows(out_features: int, in_features: int, prepacked: bool, stream_bytes: int) -> int:
    """The most rows (of `PROBE_ROWS`) up to which ATen's gemv beats the other kernel (the prepacked one,
    or torch's default where prepacking is unsupported) for a bf16 weight of this shape; 0 where it never
    does. Timed once per machine and software version (`choices.cached`: later processes read the answer)
    by `time_gemv_rows`, decided by `pick_gemv_rows`."""
    name = f"gemv_rows bf16 {out_features}x{in_features} prepacked={prepacked} stream={stream_bytes}"
    timings = functools.partial(time_gemv_rows, out_features, in_features, prepacked, stream_bytes)
    return choices.cached(name, timings, pick_gemv_rows)[0]


def probe_layers(out_features: int, in_features: int, stream_bytes: int) -> list[CpuLinear]:
    """Random bf16 copies of one shape adding up to `stream_bytes` (at most `MAX_COPIES`), so a probe streams its
    weights from memory as the model does rather than from cache."""
    copies = min(MAX_COPIES, max(1, -(-stream_bytes // (out_features * in_features * 2))))
    return [CpuLinear(nn.Linear(in_features, out_features, bias=False, dtype=torch.bfloat16)) for _ in range(copies)]


def time_gemv_rows(out_features: int, in_features: int, prepacked: bool, stream_bytes: int) -> dict:
    """{rows: {"gemv": s, "other": s}} up to the first row count where the gemv is not clearly faster. Timed
    over copies of the weight adding up to `stream_bytes` (the model's linear weights, at most `PROBE_BYTES`),
    so that they stream from memory when a decode step's weights would: timed on one cache-resident copy,
    the answer flipped for three of SmolLM2's five shapes."""
    layers = probe_layers(out_features, in_features, stream_bytes)
    kernels = {
        "gemv": [m.gemv for m in layers],
        "other": [m.prepacked if prepacked else m.torch_default for m in layers],
    }
    timings = {}
    with torch.inference_mode():
        for rows in PROBE_ROWS:
            x = torch.randn(rows, in_features, dtype=torch.bfloat16)
            t = interleaved_medians({name: lambda fs=fs, x=x: [f(x) for f in fs] for name, fs in kernels.items()})
            timings[str(rows)] = t
            if not clearly_faster(t["gemv"], t["other"]):
                break
    return timings


def pick_gemv_rows(timings: dict) -> int:
    """The rule: the most rows up to which the gemv was clearly faster (`clearly_faster`), counting up from
    the fewest rows of `{rows: {"gemv": s, "other": s}}`; 0 where it never was. A near-tie goes to the kernel
    that equals torch's."""
    best = 0
    for rows, t in sorted((int(rows), t) for rows, t in timings.items()):
        if not clearly_faster(t["gemv"], t["other"]):
            break
        best = rows
    return best


OWN_PROBE_ROWS = tuple(r for r in PROBE_ROWS if r <= cpu_bf16.MAX_ROWS)  # the counts specbench's kernel is timed at


def own_probe(rows: int) -> int | None:
    """The probed count that decides `rows` rows: the fewest of `OWN_PROBE_ROWS` at or above it (a verify of 6 rows
    is decided at 8); None past `cpu_bf16.MAX_ROWS`."""
    return next((r for r in OWN_PROBE_ROWS if r >= rows), None)


def own_spans(own_counts: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The widths 1..`cpu_bf16.MAX_ROWS` whose probed count (`own_probe`) is in `own_counts`, as (fewest, most) spans:
    (1, 4, 8) -> ((1, 1), (3, 8))."""
    widths = itertools.groupby(range(1, cpu_bf16.MAX_ROWS + 1), key=lambda rows: own_probe(rows) in own_counts)
    return tuple((run[0], run[-1]) for own, group in widths if own for run in [list(group)])


@functools.cache
def own_row_counts(out_features: int, in_features: int, prepacked: bool, stream_bytes: int) -> tuple[int, ...]:
    """The counts of `OWN_PROBE_ROWS` at which specbench's bf16 kernel is not beaten by either of torch's (ATen's
    gemv and the prepacked or default kernel) for this shape; () where it never is or is not built. Timed once per
    machine and software version (`choices.cached`) by `time_own_rows`, decided by `pick_own_rows`."""
    if not cpu_bf16.available():
        return ()
    name = f"own_row_counts bf16 {out_features}x{in_features} prepacked={prepacked} stream={stream_bytes}"
    timings = functools.partial(time_own_rows, out_features, in_features, prepacked, stream_bytes)
    return tuple(choices.cached(name, timings, pick_own_rows)[0])  # a list when read back from the cache file


def time_own_rows(out_features: int, in_features: int, prepacked: bool, stream_bytes: int) -> dict:
    """{rows: {"own": s, "gemv": s, "other": s}} at every count of `OWN_PROBE_ROWS`, over weight copies adding up to
    `stream_bytes` (as `time_gemv_rows`). Every count, not up to the first that torch's kernels win: one that wins a
    decode step's row can still lose a verify's γ + 1 by several times."""
    layers = probe_layers(out_features, in_features, stream_bytes)
    kernels = {
        "own": [m.own for m in layers],
        "gemv": [m.gemv for m in layers],
        "other": [m.prepacked if prepacked else m.torch_default for m in layers],
    }
    timings = {}
    with torch.inference_mode():
        for rows in OWN_PROBE_ROWS:
            x = torch.randn(rows, in_features, dtype=torch.bfloat16)
            timings[str(rows)] = interleaved_medians(
                {name: lambda fs=fs, x=x: [f(x) for f in fs] for name, fs in kernels.items()}
            )
    return timings


def pick_own_rows(timings: dict) -> tuple[int, ...]:
    """The rule: each probed row count on its own, specbench's kernel at those where no kernel of torch's was clearly
    faster (`clearly_faster`). A near-tie goes to specbench's kernel: it streams the weight once whatever the rows (up
    to `MAX_ROWS`), so the one kernel that ties at a decode step's row is the one that stays fast at a verify's γ + 1
    rows, where torch's gemv slows with every row (analysis/bf16_matvec_cpu_avx512). One that loses the decode step's
    row can still win every verify's (analysis/avx2_verify_cpu_avx512). Counts, not a range: a range (the longest run
    of won counts) gave a head that won the one-row step by 27% to torch's kernel there, because it lost the 2-row
    count between wins at 1, 4 and 8 (analysis/profile_step_cpu_avx512_avx2_path/)."""
    return tuple(
        rows
        for rows, t in sorted((int(rows), t) for rows, t in timings.items())
        if not clearly_faster(min(t["gemv"], t["other"]), t["own"])
    )


WIDE_ROWS = 64  # a prompt chunk: the rows at which `upcast_wide` times the kernels past the gemv's
# The upcast widens the whole weight per call, which pays over a prompt's rows, not a decode step's or a verify's
# (on the AVX2-only path it was 2.1x faster than torch's bf16 linear at 16 rows:
# analysis/prefill_upcast_cpu_amx_avx2_only/).
UPCAST_MIN_ROWS = 16


@functools.cache
def upcast_wide(out_features: int, in_features: int, stream_bytes: int) -> bool:
    """Whether a `CpuLinear` of this shape runs its rows past the gemv's widened to float32 (`CpuLinear.upcast`)
    rather than torch's bf16 linear, where oneDNN cannot prepack bf16 (an AVX2-only CPU: there torch's bf16 linear
    prefilled 3.8-6.8x slower, analysis/prefill_upcast_cpu_amx_avx2_only/). Timed once per machine and software
    version (`choices.cached`) by `time_wide`, decided by `pick_wide`."""
    name = f"upcast_wide bf16 {out_features}x{in_features} stream={stream_bytes}"
    timings = functools.partial(time_wide, out_features, in_features, stream_bytes)
    return choices.cached(name, timings, pick_wide)[0]


def time_wide(out_features: int, in_features: int, stream_bytes: int) -> dict:
    """{"upcast": s, "torch": s}: `WIDE_ROWS` rows through weight copies adding up to `stream_bytes` (as
    `time_gemv_rows`), widened to float32 for the call or in torch's bf16 linear."""
    layers = probe_layers(out_features, in_features, stream_bytes)
    x = torch.randn(WIDE_ROWS, in_features, dtype=torch.bfloat16)
    with torch.inference_mode():
        return interleaved_medians(
            {"upcast": lambda: [m.upcast(x) for m in layers], "torch": lambda: [m.torch_default(x) for m in layers]}
        )


def pick_wide(timings: dict) -> bool:
    """The rule: widen only where that is clearly faster (`clearly_faster`); a near-tie keeps torch's kernel."""
    return clearly_faster(timings["upcast"], timings["torch"])


class CpuLinear(nn.Linear):
    """An nn.Linear (same parameters, so ties, quantizers and state dicts see no difference) whose bf16
    CPU forward takes specbench's bf16 kernel at the row counts its probe decides for it (`own_counts`, `takes_own`;
    also inside a `torch.compile` trace), else ATen's gemv up to `gemv_rows` rows and oneDNN with a prepacked weight
    past them; where oneDNN cannot prepack bf16, torch's bf16 linear or, from `UPCAST_MIN_ROWS` rows where
    `upcast_wide` measured it faster, the weight widened to float32.

    Anything else (another dtype or device, autograd, a `torch.compile` trace outside those rows, which
    inductor prepacks on its own) runs `nn.Linear.forward`. The prepacked copy is made by `pack` (at tuning; a copy of the layer makes
    its own on first use, since `__getstate__` leaves it out: opaque oneDNN tensors cannot be copied)."""

    isa = cpu_bf16.AUTO  # the own kernel's path (`cpu_bf16.isa_path`); a side-by-side comparison sets another
    upcast_wide = False  # measured per shape by `tune_cpu_linears` where oneDNN cannot prepack bf16

    def __init__(self, linear: nn.Linear, gemv_rows: int = 1, own_counts: tuple[int, ...] = ()) -> None:
        nn.Module.__init__(self)  # nn.Linear's own __init__ would allocate and initialise a weight
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameters: a tied head stays tied
        self.register_parameter("bias", linear.bias)
        self.can_prepack = prepack_supported()
        self.packed: torch.Tensor | None = None
        self.gemv_rows = gemv_rows  # measured per shape by `tune_cpu_linears`
        self.own_counts = own_counts  # measured per shape by `tune_cpu_linears`

    @property
    def own_counts(self) -> tuple[int, ...]:
        """The probed counts that take specbench's kernel (`own_probe` maps a width to one)."""
        return self._own_counts

    @own_counts.setter
    def own_counts(self, counts: tuple[int, ...]) -> None:
        if counts and not cpu_bf16.available():
            raise ValueError(
                f"CpuLinear own_counts={tuple(counts)}: specbench's bf16 kernel is not built here; allowed: ()"
            )
        if any(r not in OWN_PROBE_ROWS for r in counts):
            raise ValueError(f"CpuLinear own_counts={tuple(counts)}: allowed counts are {OWN_PROBE_ROWS}")
        self._own_counts = tuple(sorted(set(counts)))
        self.own_spans = own_spans(self._own_counts)  # what `forward` asks, kept with the counts

    def takes_own(self, rows: int) -> bool:
        """Whether `rows` activation rows take specbench's kernel: as its probed count (`own_probe`) was decided. Asked
        as spans of widths, so a compiled trace over a symbolic width guards only where the decision changes (every
        verify width on one graph where all are won)."""
        return any(low <= rows <= high for low, high in self.own_spans)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["packed"] = None  # an opaque oneDNN tensor cannot be copied; the copy repacks on first use
        return state

    def own(self, x: torch.Tensor) -> torch.Tensor:
        """specbench's bf16 kernel (`cpu_bf16.bf16_matvec`), called as the op so a compiled graph keeps it."""
        y = torch.ops.specbench.bf16_matvec(x.reshape(-1, self.in_features), self.weight, self.bias, self.isa)
        return y.reshape(*x.shape[:-1], self.out_features)

    def gemv(self, x: torch.Tensor) -> torch.Tensor:
        return aten_gemv(x, self.weight, self.bias)

    def pack(self) -> None:
        """Make the prepacked copy now (not inside a timed forward); a no-op where oneDNN cannot."""
        if self.packed is None and self.can_prepack:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), 1)

    def prepacked(self, x: torch.Tensor) -> torch.Tensor:
        self.pack()
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def torch_default(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)

    def upcast(self, x: torch.Tensor) -> torch.Tensor:
        """The product in float32, the weight widened for this call (bf16 values exactly), rounded back to x's dtype."""
        bias = None if self.bias is None else self.bias.float()
        return nn.functional.linear(x.float(), self.weight.float(), bias).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plain = (
            x.device.type == "cpu"
            and x.dtype == self.weight.dtype == torch.bfloat16
            and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
        )
        rows = x.numel() // max(1, x.shape[-1])
        if plain and self.takes_own(rows):
            return self.own(x)
        if not plain or torch.compiler.is_compiling():
            return super().forward(x)
        if rows <= self.gemv_rows:
            return self.gemv(x)
        if self.can_prepack:
            return self.prepacked(x)
        return self.upcast(x) if self.upcast_wide and rows >= UPCAST_MIN_ROWS else self.torch_default(x)


def tune_cpu_linears(model: nn.Module) -> dict[str, int]:
    """Swap every bf16 CPU nn.Linear of `model` for a `CpuLinear`, in place, unless their prepacked copies
    would take over `MAX_MEMORY_SHARE` of the machine's memory. Returns `linear_kernels(model)`."""
    linears = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and child.weight.dtype == torch.bfloat16 and child.weight.device.type == "cpu"
    ]
    packed_bytes = sum(c.weight.numel() * c.weight.element_size() for _, _, c in linears)
    if packed_bytes > MAX_MEMORY_SHARE * physical_memory():
        return {}
    prepacked, stream = prepack_supported(), min(PROBE_BYTES, packed_bytes)
    for parent, name, child in linears:
        shape = (child.out_features, child.in_features, prepacked, stream)
        layer = CpuLinear(child, gemv_rows(*shape), own_row_counts(*shape))
        layer.upcast_wide = not prepacked and upcast_wide(child.out_features, child.in_features, stream)
        layer.pack()
        setattr(parent, name, layer)
    return linear_kernels(model)


def linear_kernels(model: nn.Module) -> dict[str, int]:
    """Per CpuLinear weight shape, the rows up to which it takes ATen's gemv (for job records)."""
    return {f"bf16 {m.out_features}x{m.in_features}": m.gemv_rows for m in model.modules() if isinstance(m, CpuLinear)}


def physical_memory() -> int:
    """Bytes of physical memory on this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

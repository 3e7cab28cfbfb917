"""specbench's own CPU kernels, as torch ops: weight-only int8 and int4 products for float32 activations (AVX2 +
FMA; int8 also for bf16 ones, and on AVX-512 VNNI; `cpu_matvec.cpp`), one-query attention in float32 or bf16
(`cpu_attention.cpp`), the bf16 weight kernels (`cpu_bf16.cpp`) and the read probes (`cpu_stream.cpp`; both
registered by `cpu_bf16`).

torch has none that stream at memory speed on an AVX2 CPU: its int8 kernel takes bf16 activations only
and its int4 kernel is compute-bound there, so a W8A16 / W4A16 draft of an fp32 target cost more than
the target (`analysis/fast_path_fp32_cpu_amx_avx2_kernels/`). These quantize the activations to int8 per
block of 32 and stream the weights once per step. They are built on first use (~30 s, then cached by
torch under TORCH_EXTENSIONS_DIR; a build killed halfway leaves torch's lock file, which the next load
removes, saying so, before it builds again) and registered as `torch.ops.specbench.*`, so `torch.compile` calls
them like any op. Where they cannot be built (not x86 with AVX2 and FMA, no C++ compiler) or are switched
off (`SPECBENCH_CPU_MATVEC=0`, to measure torch's kernels instead), `available()` is False and the
quantized layers use torch's kernels (and attention inductor's).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import platform
import sys
import warnings
from pathlib import Path

import torch

from specbench.bench.envinfo import cpu_isa_flags

SOURCES = tuple(
    Path(__file__).with_name(f)
    for f in ("cpu_matvec.cpp", "cpu_attention.cpp", "cpu_attention_bf16.cpp", "cpu_bf16.cpp", "cpu_stream.cpp")
)
NAME = "specbench_cpu_matvec"  # the extension's name, and its build folder's
CLAIM = "specbench.lock"  # in the build folder: flock'ed by the process building or loading the kernels
SWITCH_ENV = "SPECBENCH_CPU_MATVEC"  # "0" leaves the weight-only layers on torch's kernels, attention on inductor's
REQUIRED_FLAGS = ("avx2", "fma")
BLOCK = 32  # activation block, the kernels' unit; an int4 weight group is 1, 2, 4 or 8 of them
MAX_HEAD_DIM = 128  # cpu_attention.cpp's largest head dim (a query held in 16 AVX2 registers), checked there too
ATTENTION_AUTO, ATTENTION_AVX2, ATTENTION_AVX512_BF16, ATTENTION_AMX_BF16 = 0, 1, 2, 3  # cache_attention's `isa`
ATTENTION_FORMS = {ATTENTION_AVX2: "avx2", ATTENTION_AVX512_BF16: "avx512_bf16", ATTENTION_AMX_BF16: "amx_bf16"}
MAX_QUERY_ROWS = 16  # cpu_attention.cpp's most query rows a sequence (past it a prefill: bmm's reuse wins)
_loaded = False  # whether `available()` registered the ops in this process


@functools.cache
def available() -> bool:
    """Whether the kernels are built and loaded in this process (built here on the first call)."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return False
    if platform.machine().lower() not in ("x86_64", "amd64") or not set(REQUIRED_FLAGS) <= set(cpu_isa_flags()):
        return False
    from torch.utils import cpp_extension

    try:
        build = build_directory()
        with build_claim(build):
            clear_stale_lock(build)
            cpp_extension.load(
                name=NAME,
                sources=[str(p) for p in SOURCES],
                extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],  # OpenMP: at::parallel_for runs threaded
                extra_ldflags=["-fopenmp"],
                build_directory=str(build),
                is_python_module=False,
            )
    except Exception as exc:  # no compiler or ninja, a failed build: torch's kernels still work
        warnings.warn(
            f"specbench's AVX2 weight-only kernels could not be built ({type(exc).__name__}: {exc}); "
            f"float32 int8/int4 layers fall back to torch's kernels (set {SWITCH_ENV}=0 to skip the build)",
            stacklevel=2,
        )
        return False
    torch.library.register_fake("specbench::int8_matvec")(_int8_shape)
    torch.library.register_fake("specbench::int4_matvec")(_int4_shape)
    torch.library.register_fake("specbench::cache_attention")(_attention_shape)
    global _loaded
    _loaded = True
    return True


def build_directory() -> Path:
    """Where torch builds the kernels: the folder its `load` picks by default (TORCH_EXTENSIONS_DIR, else
    its default root's py<version>_<accelerator> folder), named here so its lock can be checked."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        accelerator = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
        if torch.version.hip is not None:
            accelerator = f"rocm{torch.version.hip.replace('.', '')}"
        python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
        root = os.path.join(get_default_build_root(), f"{python}_{accelerator}")
    return Path(root) / NAME


@contextlib.contextmanager
def build_claim(build: Path):
    """Hold an exclusive `flock` on `build`/specbench.lock while torch builds or loads the kernels. The kernel
    drops it when the holder dies, however it dies, so whoever holds it knows no live specbench process is
    building there."""
    build.mkdir(parents=True, exist_ok=True)
    with open(build / CLAIM, "a+") as claim:
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"specbench: waiting for another process building specbench's kernels in {build}", file=sys.stderr)
            fcntl.flock(claim, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(claim, fcntl.LOCK_UN)


def clear_stale_lock(build: Path) -> bool:
    """Under `build_claim`: remove torch's `lock` in `build` when no live process holds it open (torch's builder
    keeps it open from taking it to releasing it; a build killed in between leaves it, and torch would wait on
    it forever), saying so on stderr. True if removed. A lock some process holds is left to it."""
    lock = build / "lock"
    if not lock.exists() or lock_holders(lock):
        return False
    print(
        f"specbench: removing the stale build lock {lock} (a build of specbench's kernels was killed); "
        "building them again",
        file=sys.stderr,
    )
    lock.unlink(missing_ok=True)
    return True


def lock_holders(lock: Path) -> list[int]:
    """Pids of the processes that have `lock` open (Linux /proc; processes this user cannot read are not seen,
    and off Linux the answer is empty: the `build_claim` alone tells specbench's builds apart there)."""
    target, holders = str(lock.resolve()), []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == target for fd in fd_dir.iterdir()):
                holders.append(int(fd_dir.parent.name))
        except OSError:  # gone, or not ours to read
            continue
    return holders


def loaded() -> bool:
    """Whether `available()` has loaded the kernels in this process; never builds them (cheap, traceable)."""
    return _loaded


def _ops(op: str):
    """The registered ops, built on first use; a clear error where they cannot be (not a missing attribute)."""
    if not _loaded and not available():
        raise RuntimeError(
            f"cpu_matvec.{op}: specbench's AVX2 weight-only kernels are not available in this process "
            f"({SWITCH_ENV}={os.environ.get(SWITCH_ENV, '1')!r}; they need x86-64 with {' and '.join(REQUIRED_FLAGS)} "
            f"and a C++ compiler); check cpu_matvec.available() first"
        )
    return torch.ops.specbench


def _int8_shape(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def _int4_shape(x: torch.Tensor, nibbles: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], nibbles.shape[0])


def _attention_shape(
    q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask, scale: float, isa: int = ATTENTION_AUTO
) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[2], q.shape[1], q.shape[3])


def int8_matvec(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 or bf16 @ (weight [N, K] int8 · scale [N], float32 or x's dtype).T → [M, N] in x's dtype,
    x rounded to int8 per block of 32. AVX-512 VNNI where the CPU and torch's kernel level have it, else AVX2."""
    return _ops("int8_matvec").int8_matvec(x, weight, scale)


def int4_matvec(x: torch.Tensor, nibbles: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 @ w.T → [M, N], w[n, k] = q[n, k] · scale[n, k/G] + low[n, k/G] with q packed by
    `pack_nibbles`; x rounded to int8 per block of 32. The weight group G is read off scale [N, ceil(K/G)]: 32
    times the fewest blocks (1, 2, 4, ...) that make its columns; a last group may be shorter (576 at 128)."""
    return _ops("int4_matvec").int4_matvec(x, nibbles, scale, low)


def cache_attention(
    q: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    isa: int = ATTENTION_AUTO,
) -> torch.Tensor:
    """softmax(scale · q·keyᵀ + mask) · value for a few query rows a sequence: q [B, H, k, d], 1 ≤ k ≤
    `MAX_QUERY_ROWS` (H = G·r, r query heads per key/value head, as transformers orders them), key/value [B, G, C, d]
    (a view of a longer cache is read in place), additive mask [B, 1, k, C] (float32 or q's dtype; a verify's causal
    rows are the mask's) or None; all float32 or all bf16 (summed in float32); d a multiple of 8, at most
    `MAX_HEAD_DIM`. Returns [B, k, H, d] in q's dtype (transformers' attention output layout). `isa` picks a form
    (`ATTENTION_FORMS`; auto: the best `attention_form` finds)."""
    return _ops("cache_attention").cache_attention(q, key, value, mask, scale, isa)


def attention_form(isa: int = ATTENTION_AUTO, dtype: torch.dtype = torch.bfloat16, head_dim: int = 64) -> str:
    """The form `cache_attention` runs for `isa` on this machine and process at that dtype and head dim: 'avx2',
    'avx512_bf16' (bf16, d a multiple of 32) or 'amx_bf16' (its scores on AMX tiles); an error where it cannot."""
    return ATTENTION_FORMS[_ops("attention_form").cache_attention_isa(isa, dtype == torch.bfloat16, head_dim)]


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] in 0..15 → uint8 [N, K/2] in the int4 kernel's order. Per pair of blocks of 32 (b, b + 1),
    32 bytes in 4-byte groups alternating b, b + 1 (b's slots 0-3, b + 1's 0-3, b's 4-7, ...); slot s of a
    block holds q[s] (low nibble) and q[16 + s] (high). An odd last block: byte i holds q[i] and q[16 + i].
    So one AVX2 multiply covers two blocks with no lane permute, and its sums alternate between them."""
    n, k = q.shape
    q = q.to(torch.uint8)
    pairs = k // (2 * BLOCK)
    # [N, pair, block, half, group, byte]: half 0 → low nibbles (slots 0-15), 1 → high (16-31)
    head = q[:, : pairs * 2 * BLOCK].reshape(n, pairs, 2, 2, 4, 4)
    packed = (head[:, :, :, 0] | (head[:, :, :, 1] << 4)).permute(0, 1, 3, 2, 4)  # [N, pair, group, block, byte]
    tail = q[:, pairs * 2 * BLOCK :].reshape(n, -1, 2, BLOCK // 2)  # an odd last block, or nothing
    return torch.cat([packed.reshape(n, -1), (tail[:, :, 0] | (tail[:, :, 1] << 4)).reshape(n, -1)], 1).contiguous()


def quantize_blocks(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] as the kernels see it: rounded to int8 per block of 32 (scale = block max / 127), in float64."""
    blocks = x.double().reshape(x.shape[0], -1, BLOCK)
    scale = blocks.abs().amax(-1, keepdim=True) / 127
    q = torch.where(scale > 0, torch.round(blocks / scale.clamp_min(1e-300)), 0.0)
    return (q * scale).reshape(x.shape)

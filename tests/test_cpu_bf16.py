"""specbench's bf16 weight kernel and read probe (`specbench.models.cpu_bf16`): results equal an fp32 reference
to bf16 rounding on both ISA paths, ATEN_CPU_CAPABILITY picks the path, a compiled graph calls (and fuses) it,
and the kernel choice follows its rule on given timings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import tiny_llama
from torch import nn
from torch._dynamo.utils import counters

from specbench.models import cpu_bf16
from specbench.models.kernels import CpuLinear, own_spans, pick_own_rows
from specbench.models.matvec_fusion import FUSION_PASS, weights_fingerprint

if not cpu_bf16.available():
    pytest.skip("specbench's kernels are not available here (no AVX2/FMA or no compiler)", allow_module_level=True)

ISAS = [cpu_bf16.AVX2, cpu_bf16.AVX512_BF16, cpu_bf16.AMX_BF16]


def _isa_param(isa: int):
    try:
        return pytest.param(isa, id=cpu_bf16.isa_path(isa))
    except RuntimeError as exc:
        return pytest.param(isa, marks=pytest.mark.skip(reason=str(exc).splitlines()[0]))


@pytest.mark.parametrize("isa", [_isa_param(i) for i in ISAS])
@pytest.mark.parametrize("shape", [(96, 64), (37, 70), (5, 33), (19, 88), (300, 576), (64, 1536), (530, 96)])
def test_matvec_equals_an_fp32_reference(isa, shape):
    """Rows 1..9 (9 = one pass of 8 and one of 1; 2..6 two weight rows a pass on AVX2), odd K (masked / scalar
    tails), odd N (a weight row alone); on AMX blocks of 16 weight rows from 512 rows (530: 33 blocks and 2 rows on
    AVX-512; the rest, or K not a multiple of 32, all on AVX-512); K = 88: 24 past the last 32."""
    n, k = shape
    g = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    bias = torch.randn(n, generator=g).to(torch.bfloat16)
    for rows in (1, 2, 3, 4, 5, 6, 7, 8, 9):
        x = torch.randn(rows, k, generator=g).to(torch.bfloat16)
        ref = x.double() @ w.double().T + bias.double()
        y = cpu_bf16.bf16_matvec(x, w, bias, isa)
        assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
        # fp32 sums, one bf16 rounding of the result: within 2^-8 of each output's scale
        scale = (x.double().abs() @ w.double().abs().T + bias.double().abs()).clamp_min(1e-6)
        assert ((y.double() - ref).abs() / scale).max() < 2**-7, (isa, shape, rows)
        y32 = cpu_bf16.bf16_matvec(x.float(), w, None, isa)  # fp32 activations: fp32 out
        assert y32.dtype == torch.float32
        torch.testing.assert_close(y32.double(), x.double() @ w.double().T, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("isa", [_isa_param(i) for i in ISAS])
def test_bf16_rows_give_the_widened_rows_result_bit_for_bit(isa):
    """bf16 activations (widened inside the kernel on AVX2, a pass of 8 rows at a time, into a buffer kept between
    calls) give exactly what their float32 values give, rounded once: across passes (17 rows: 8 + 8 + 1), across
    calls that grow the kept buffer and then use part of it, and for a strided x."""
    g = torch.Generator().manual_seed(7)
    for n, k, rows in ((40, 96, 3), (64, 1536, 1), (20, 70, 12), (33, 576, 9), (64, 1536, 17), (40, 96, 2)):
        w = torch.randn(n, k, generator=g).to(torch.bfloat16)
        wide = torch.randn(rows, 2 * k, generator=g).to(torch.bfloat16)
        for x in (wide[:, :k].contiguous(), wide[:, ::2]):  # contiguous, and every other column
            want = cpu_bf16.bf16_matvec(x.float(), w, None, isa).to(torch.bfloat16)
            assert torch.equal(cpu_bf16.bf16_matvec(x, w, None, isa), want), (n, k, rows, x.is_contiguous())


def test_bad_inputs_are_named():
    w = torch.zeros(4, 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="weight dtype Float; allowed: bfloat16"):
        cpu_bf16.bf16_matvec(torch.zeros(1, 8), w.float())
    with pytest.raises(RuntimeError, match="isa 7 is not one of"):
        cpu_bf16.bf16_matvec(torch.zeros(1, 8), w, None, 7)


def test_stream_sum_is_the_buffers_sum():
    buf = torch.rand(1_000_003, generator=torch.Generator().manual_seed(0))
    for isa in (cpu_bf16.AUTO, cpu_bf16.AVX2):
        assert abs(cpu_bf16.stream_sum(buf, isa).item() - buf.double().sum().item()) < 1e-4 * buf.numel()


def _words_sum(tensors) -> int:
    total = 0
    for t in tensors:
        raw = t.contiguous().view(torch.uint8).flatten()
        total += int((raw[: raw.numel() // 4 * 4].view(torch.int32).to(torch.int64) & 0xFFFFFFFF).sum())
    return total % (1 << 32)


def test_stream_read_reads_every_word_of_every_tensor_in_place():
    """The own-weights read probe: any dtype's bytes as 32-bit words, summed mod 2^32 across the tensors laid end
    to end and split over the threads (a tensor's last nbytes % 4 bytes left out), on every path and thread count."""
    gen = torch.Generator().manual_seed(0)
    tensors = [
        torch.randint(-128, 128, (1000, 77), dtype=torch.int8, generator=gen),  # int8 words: denormal floats
        torch.randn(333, 5, generator=gen).bfloat16(),
        torch.randn(100_003, generator=gen),
        torch.zeros(3, dtype=torch.int8),  # under a word: nothing read
    ]
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for isa in (cpu_bf16.AUTO, cpu_bf16.AVX2):
                assert cpu_bf16.stream_read(tensors, isa).item() == _words_sum(tensors)
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="stream_read: no tensors to read"):
        cpu_bf16.stream_read([])
    with pytest.raises(RuntimeError, match="stream_read: contiguous CPU tensors"):
        cpu_bf16.stream_read([torch.zeros(8, 8).t()])


def test_aten_cpu_capability_avx2_takes_the_avx2_path():
    code = "from specbench.models import cpu_bf16; cpu_bf16.available(); print(cpu_bf16.isa_path())"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "avx2"


def test_pick_own_rows_on_given_timings():
    t = {"1": {"own": 0.5, "gemv": 1.0, "other": 2.0}, "2": {"own": 1.2, "gemv": 1.0, "other": 1.05}}
    assert pick_own_rows(t) == (1,)  # at 2 rows torch's gemv (1.0) is under 0.9 x specbench's (1.2)
    t["2"].update(gemv=2.0, other=2.0)
    assert pick_own_rows(t) == (1, 2)
    assert pick_own_rows({"1": {"own": 1.0, "gemv": 0.8, "other": 1.0}}) == ()  # clearly slower at one row


def test_a_tie_at_one_row_keeps_the_kernel_that_stays_fast_at_a_verifys_rows():
    """The kernel measured on the AVX-512 EPYC: level with torch's gemv at one row, 1.5x faster at 2 rows, ~5x
    at 8. The old rule (clearly faster at every row, counting from one) gave it 0 rows, so a compiled verify of γ + 1
    rows ran inductor's GEMM at 2.4x the one-row step."""
    t = {"1": {"own": 1.02, "gemv": 1.0, "other": 3.0}}
    t |= {str(r): {"own": 1.05, "gemv": 0.9 + 0.45 * r, "other": 3.0} for r in (2, 4, 8)}
    assert pick_own_rows(t) == (1, 2, 4, 8)


def test_a_kernel_that_loses_the_one_row_step_still_takes_the_verifys_rows():
    """The EPYC's AVX2 path: the down projection (576 x 1536) took torch's gemv 1.2x faster at one row, so the rule
    that counted up from one row gave specbench's kernel no rows at all, and every verify ran torch's kernels, which
    slow with each row (the gemv 1.5 ms a row at 1, ~5.5 at 4 for the 48 MB probe). It takes the rows it wins."""
    t = {"1": {"own": 1.82, "gemv": 1.61, "other": 1.53}}
    t |= {str(r): {"own": 1.8 + 0.3 * r, "gemv": 1.5 * r, "other": 1.5 * r} for r in (2, 4, 8)}
    assert pick_own_rows(t) == (2, 4, 8)
    t["4"].update(gemv=1.0)  # a lone loss in the middle is that count's alone
    assert pick_own_rows(t) == (2, 8)


def test_a_loss_at_two_rows_does_not_cost_the_one_row_step():
    """The LM head as probed on the EPYC's AVX-512 path: specbench's kernel 0.73x torch's best at one row, 1.16x at
    2 (a clear loss), 1.03x at 4, 0.89x at 8. The longest run of won counts, (4, 8), gave the one-row step (every
    plain decode step) to torch's kernel. Seen failing before the per-count rule: it returned (4, 8)."""
    t = {
        "1": {"gemv": 3.660, "other": 3.621, "own": 2.642},
        "2": {"gemv": 3.455, "other": 6.048, "own": 3.995},
        "4": {"gemv": 11.889, "other": 2.993, "own": 3.073},
        "8": {"gemv": 12.136, "other": 2.606, "own": 2.324},
    }
    assert pick_own_rows(t) == (1, 4, 8)


def test_a_linear_takes_its_kernel_at_the_counts_decided_for_it(monkeypatch):
    """A width takes the decision of the fewest probed count at or above it (`own_probe`): 3 rows as 4, 5 as 8."""
    layer = CpuLinear(nn.Linear(64, 32, bias=False).to(torch.bfloat16), gemv_rows=16, own_counts=(1, 4))
    calls = []
    for kernel in ("own", "gemv"):
        monkeypatch.setattr(layer, kernel, lambda x, k=kernel: calls.append((k, x.shape[0])) or layer.torch_default(x))
    with torch.inference_mode():
        for rows in (1, 2, 3, 4, 5, 9):
            layer(torch.randn(rows, 64, dtype=torch.bfloat16))
    assert calls == [("own", 1), ("gemv", 2), ("own", 3), ("own", 4), ("gemv", 5), ("gemv", 9)]
    assert layer.own_spans == ((1, 1), (3, 4))
    assert own_spans((1, 2, 4, 8)) == ((1, 8),) and own_spans((2, 8)) == ((2, 2), (5, 8)) and own_spans(()) == ()
    with pytest.raises(ValueError, match=r"own_counts=\(3,\): allowed counts are \(1, 2, 4, 8\)"):
        CpuLinear(nn.Linear(64, 32, bias=False).to(torch.bfloat16), own_counts=(3,))


@pytest.mark.parametrize(("counts", "graphs"), [((1, 2, 4, 8), 1), ((1, 4, 8), 1), ((2, 8), 2)])
def test_a_symbolic_width_guards_only_where_the_kernel_changes(counts, graphs):
    """A compiled verify over a symbolic width asks `takes_own` as spans, so widths 3-7 share a graph where their
    decisions agree (asked per probed count, every count past a width's own added a guard: 3 graphs here) and part
    where they do not ((2, 8): 3-4 take torch's kernel, 5-7 specbench's)."""
    layer = CpuLinear(nn.Linear(64, 32, bias=False).to(torch.bfloat16), gemv_rows=0, own_counts=counts)
    compiled = []

    def record(gm, example_inputs):
        compiled.append(any("bf16_matvec" in str(node.target) for node in gm.graph.nodes))
        return gm.forward

    step = torch.compile(layer, backend=record, dynamic=True)
    with torch.inference_mode():
        for rows in (3, 5, 7, 4, 6):
            x = torch.randn(rows, 64, dtype=torch.bfloat16)
            torch.testing.assert_close(step(x), layer.torch_default(x), rtol=2**-7, atol=1e-2)
    assert len(compiled) == graphs
    assert compiled == ([True] if graphs == 1 else [False, True])  # (2, 8): widths 3-4 on torch's, 5-7 on ours


def test_compiled_graph_calls_the_kernel_and_fuses_shared_inputs():
    """~10 s: a tiny model whose bf16 linears take the kernel; compiled with freezing and the fusion pass, its
    q/k/v and gate/up calls become one each, and its logits match eager's to bf16 rounding."""
    import torch._inductor.config as inductor

    model = tiny_llama(0, dtype=torch.bfloat16).eval()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, CpuLinear(child, own_counts=(1, 2, 4, 8)))
    ids = torch.randint(0, 96, (1, 3), generator=torch.Generator().manual_seed(1))
    FUSION_PASS.weights = weights_fingerprint(model)
    before = counters["specbench"]["fused_matvec_calls"]
    # The pass runs only on a cache miss: a warm inductor cache (a second CI run on one box) would count 0 calls.
    patches = dict(freezing=True, post_grad_custom_pre_pass=FUSION_PASS, fx_graph_cache=False)
    with torch.inference_mode(), inductor.patch(**patches):
        eager = model(ids).logits
        compiled = torch.compile(model, dynamic=False)(ids).logits
    assert counters["specbench"]["fused_matvec_calls"] - before == 2 * (2 + 1)  # per layer: q/k/v -> 1, gate/up -> 1
    torch.testing.assert_close(compiled.float(), eager.float(), atol=0.05, rtol=0.02)


def test_weights_fingerprint_sees_parameters():
    """The fusion pass's cache key: two models of one shape with other bf16 weights (parameters) must differ,
    or inductor's cache would hand one the other's fused weights."""
    a, b = tiny_llama(0, dtype=torch.bfloat16), tiny_llama(1, dtype=torch.bfloat16)
    assert weights_fingerprint(a) != weights_fingerprint(b)

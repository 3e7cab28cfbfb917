"""The fast path (static per-row KV cache, eager or compiled) against the reference: greedy equality,
fixed shapes, compile bookkeeping, errors, a job on it, and the audit (the cache invariant on both
paths is `tests/test_decoder.py::test_cache_invariant_after_every_round`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from conftest import VOCAB, hf_greedy, needs_embedded, tiny_llama
from test_decoder import GREEDY, make_draft

from specbench.decoding.attention import GROUPED
from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.drafts import ModelDraft
from specbench.decoding.forward import ForwardPath, capacity_for
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.sampling import SamplingConfig
from specbench.decoding.static_kv import VISIBLE_STEP, StaticLM
from specbench.models.quant import Int4Linear, quantize_w4a16


def on_path(path: str, model, capacity: int = 96):
    return ForwardPath(path, "default", capacity).lm(model)


@pytest.mark.parametrize("kind", ["model", "w8a16", "ngram"])
@pytest.mark.parametrize("batch", [1, 4])
def test_static_path_greedy_equals_target_generate(kind, batch, target, close_draft, prompts):
    ps = prompts[:batch]
    draft = make_draft(kind, target, close_draft)
    if isinstance(draft, ModelDraft):
        draft.lm = StaticLM(draft.lm.model, 96)
    result = speculative_decode(StaticLM(target, 96), draft, ps, 4, GREEDY, 24, set())
    for row, prompt in enumerate(ps):
        assert result.tokens[row] == hf_greedy(target, prompt, 24), f"row {row}"


def test_static_path_baseline_equals_generate(target, prompts):
    result = autoregressive_decode(StaticLM(target, 64), prompts, GREEDY, 20, set())
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == hf_greedy(target, prompt, 20)


def test_static_path_samples_exactly_what_the_reference_samples(target, close_draft, prompts):
    """Same seed, same random numbers: the fast path's sampled tokens equal the eager path's (float64)."""
    sampling = SamplingConfig(temperature=0.9, top_p=0.9)
    out = []
    for path in ("eager", "static"):
        f = ForwardPath(path, capacity=96)
        g = torch.Generator().manual_seed(3)
        draft = ModelDraft(close_draft, lm=f.lm(close_draft))
        out.append(speculative_decode(f.lm(target), draft, prompts, 3, sampling, 16, set(), g).tokens)
    assert out[0] == out[1]


def test_shapes_stay_fixed_when_rows_finish(target, prompts):
    lm = StaticLM(target, 64)
    lm.warm_up(4, [1])
    autoregressive_decode(lm, prompts, GREEDY, 12, {int(t) for t in range(0, VOCAB, 3)})  # early EOS on some rows
    assert lm.new_shapes == 0  # every forward was (4, 1), though rows left the batch
    lm.feed(torch.zeros(len(lm.slots), 3, dtype=torch.long))
    assert lm.new_shapes == 1  # a k warm-up did not see is counted


def test_capacity_errors_name_the_setting(target):
    lm = StaticLM(target, 8)
    with pytest.raises(ValueError, match=r"forward.capacity=8: a prompt of 9 tokens"):
        lm.prefill([list(range(9))])
    lm.prefill([list(range(6))])
    with pytest.raises(ValueError, match=r"forward.capacity=8: a row would hold 9 tokens"):
        lm.feed(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="forward.capacity=1"):
        StaticLM(target, 1)
    assert capacity_for([10, 30], 128, 4) == 192  # 30 + 128 + 4 + 2 = 164, rounded up to 64s


def test_forward_path_reuses_one_static_lm_per_model(target, close_draft):
    f = ForwardPath("static", capacity=64)
    assert f.lm(target) is f.lm(target) and f.lm(target) is not f.lm(close_draft)
    assert ForwardPath("static", capacity=128).lm(target) is not f.lm(target)
    assert ForwardPath("eager").lm(target) is not ForwardPath("eager").lm(target)  # fresh per decode
    with pytest.raises(ValueError, match="needs forward.capacity"):
        ForwardPath("static").lm(target)
    from specbench.decoding import forward

    before = dict(forward._STATIC)
    assert ForwardPath("static", capacity=32).new_shapes(target, close_draft) == 0  # never ran: nothing made
    assert forward._STATIC == before


def test_compiled_path_greedy_equals_target_generate_with_no_compile_while_decoding(target, close_draft, prompts):
    """torch.compile (inductor, frozen weights) of the target's verify and the draft's steps: the same tokens
    as transformers' greedy generate, ragged rows and finished rows included, and every shape compiled
    in warm-up."""
    f = ForwardPath("compiled", "default", 64)
    t, d = f.lm(target), f.lm(close_draft)
    seconds = f.warm_up(target, 4, [5]) + f.warm_up(close_draft, 4, [1, 2])
    assert seconds > 0 and t.compile_seconds > 0 and d.compile_seconds > 0
    result = speculative_decode(t, ModelDraft(close_draft, lm=d), prompts, 4, GREEDY, 24, set())
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == hf_greedy(target, prompt, 24), f"row {row}"
    assert f.new_shapes(target, close_draft) == 0
    # Compiled forwards run the grouped form on a copy of the modules that shares every weight; the
    # shared model keeps SDPA.
    assert t.model is not target and t.model.config._attn_implementation == GROUPED
    assert target.config._attn_implementation == "sdpa"
    assert all(a is b for a, b in zip(t.model.parameters(), target.parameters(), strict=True))
    per_round = {}
    for r in result.rounds:
        per_round.setdefault(r.round, set()).add(r.accepted)
    assert any(len(v) > 1 for v in per_round.values()), "expected rows to accept different counts"


@pytest.mark.parametrize("path", ["static", "compiled"])
def test_forwards_attend_to_the_rows_columns_not_the_capacity(path, target):
    """A forward attends to the columns its rows hold, rounded up to VISIBLE_STEP, not to the whole capacity;
    compiled, that count is a symbol of one graph per (B, k), so rows that grow past a step meet no new
    graph. Logits equal the reference's (`CachedLM`) all the way, ragged rows included."""
    fast = ForwardPath(path, "default", 4 * VISIBLE_STEP).lm(target)
    fast.warm_up(2, [1, 3])
    ref = CachedLM(target)
    g = torch.Generator().manual_seed(5)
    rows = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (40, VISIBLE_STEP + 30)]
    seen = set()
    with torch.inference_mode():
        torch.testing.assert_close(fast.prefill(rows), ref.prefill(rows))
        for step in range(30):  # the longer row crosses 2·VISIBLE_STEP, then 3·VISIBLE_STEP needs k = 3
            k = 3 if step % 4 == 3 else 1
            tokens = torch.randint(0, VOCAB, (2, k), generator=g)
            # The grouped form's softmax is fp32 (as eager attention's), the reference's SDPA fp64 throughout.
            torch.testing.assert_close(fast.feed(tokens), ref.feed(tokens), rtol=1e-4, atol=1e-5)
            seen.add(fast.cache.visible)
    longest = VISIBLE_STEP + 30 + sum(3 if s % 4 == 3 else 1 for s in range(30))
    assert seen == {2 * VISIBLE_STEP, 3 * VISIBLE_STEP} and longest > 2 * VISIBLE_STEP, (seen, longest)
    assert fast.new_shapes == 0  # compiled: a recompile for a new column count would be counted here


def test_compiled_w4a16_copy_fuses_its_linears_and_matches_its_static_forward(prompts):
    """A W4A16 copy tags itself for inductor's concatenated linears (q/k/v and gate/up as one int4 GEMM each,
    `compile_cache.compiled_forward`); compiled that way its logits are the uncompiled static path's, and the
    target it was copied from stays untagged (its bf16 GEMMs did not gain)."""
    target = tiny_llama(0, dtype=torch.float32)
    draft = quantize_w4a16(target, head="int8")
    for layer in draft.modules():
        if isinstance(layer, Int4Linear):
            layer.kernel_rows = 64  # torch's int4 kernel at every k: the op the concat pass fuses
    assert draft.config.specbench_concat_linears is True
    assert not getattr(target.config, "specbench_concat_linears", False)
    static, fast = StaticLM(draft, 64), ForwardPath("compiled", "default", 64).lm(draft)
    fast.warm_up(len(prompts), [1, 2])
    with torch.inference_mode():
        torch.testing.assert_close(fast.prefill(prompts), static.prefill(prompts))
        for k in (1, 2, 1):
            tokens = torch.arange(len(prompts) * k).reshape(len(prompts), k) % VOCAB
            torch.testing.assert_close(fast.feed(tokens), static.feed(tokens), rtol=1e-4, atol=1e-4)
    assert fast.new_shapes == 0


def test_concatenated_linears_are_asked_for_by_a_tag_or_float32_on_cpu():
    from specbench.decoding.static_kv import concat_linears

    fp32, bf16 = tiny_llama(0, dtype=torch.float32), tiny_llama(0, dtype=torch.bfloat16)
    assert concat_linears(fp32) and not concat_linears(bf16)  # fp32 GEMMs gained; bf16 ones were even
    assert concat_linears(quantize_w4a16(bf16))  # a W4A16 copy tags itself
    bf16.config.specbench_concat_linears = True
    fp32.config.specbench_concat_linears = False
    assert concat_linears(bf16) and not concat_linears(fp32)  # a tag wins either way


def test_audit_passes_on_the_static_path():
    from specbench.audit import TINY_PROMPTS, AuditSettings, make_decoder, run_audit, tiny_pair

    target, draft = tiny_pair()
    sampling = SamplingConfig(temperature=1.0, top_k=8)
    settings = AuditSettings()
    decoder = make_decoder("speculative:static", target, draft, 2, sampling, set(), settings)
    result = run_audit(target, decoder, [list(p) for p in TINY_PROMPTS], sampling, set(), settings, cache={})
    row = result.summary.iloc[0]
    assert row.decoder == "speculative:static" and row.reference == "exact"
    assert row.verdict == "pass" and row.tests >= 20, result.tests.sort_values("p_value").head()


@pytest.mark.parametrize("path", ["static", "compiled"])
def test_job_on_the_fast_path_labels_rows_and_records_the_path(path, tmp_path):
    args = ["pair=tiny", "draft=model", "workload=synthetic", "report=false", f"forward={path}"]
    args += ["forward.compile_mode=default"] if path == "compiled" else []
    args += ["max_new_tokens=6", "workload.n_prompts=2", "sweep_name=fast", f"runs_dir={tmp_path}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "specbench", *args], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    (job,) = tmp_path.glob("fast/*")
    done = json.loads((job / "done.json").read_text())
    label = "compiled:default" if path == "compiled" else path
    assert done["forward"]["path"] == label and done["forward"]["new_shapes_while_measured"] == 0
    assert done["forward"]["capacity"] % 64 == 0
    for table in ("requests", "rounds", "ct"):
        assert set(pd.read_parquet(job / f"{table}.parquet").forward) == {label}, table
    if path == "compiled":  # compiled before timing; C_t(k) only at the compiled k (1 and γ + 1 = 5)
        assert set(done["forward"]["compile_seconds"]) == {"target", "draft"}
        assert sorted(set(pd.read_parquet(job / "ct.parquet").k)) == [1, 5]


def test_a_compiled_job_with_a_weight_only_draft_compiles_its_one_token_step_only(tmp_path):
    """On the target's decode K/V the draft never catches up, so the job compiles its k = 1 forward alone; a k = 2
    forward inside the decode would be compiled there and counted."""
    args = ["pair=tiny", "draft=w8a16", "workload=synthetic", "report=false", "forward=compiled"]
    args += ["forward.compile_mode=default", "gamma=2", "max_new_tokens=12", "workload.n_prompts=2"]
    args += ["sweep_name=fast", f"runs_dir={tmp_path}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "specbench", *args], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    (job,) = tmp_path.glob("fast/*")
    done = json.loads((job / "done.json").read_text())
    assert done["forward"]["draft_decode_kv"] is True and done["forward"]["new_shapes_while_measured"] == 0
    rounds = pd.read_parquet(job / "rounds.parquet")
    assert (rounds.accepted == rounds.gamma).any()  # all-accepted rounds, which used to need a catch-up forward


@pytest.mark.parametrize("weights", [None, "int8", "int4"])
def test_dtype_auto_times_a_round_in_the_jobs_kernels(weights):
    # The probe once timed torch's default bf16 linear alone and picked fp32 on an AMX Xeon, where the
    # tuned bf16 kernels were faster and a W8A16 draft in fp32 dequantized every weight per step. What is
    # timed is checked here, never which dtype won: the choice is `pick_dtype` on given timings (below),
    # made once per machine (tests/test_auto_choices.py). A round is charged its prompt rows too: on the AVX2 path
    # bf16 decoded faster but prefilled 4-5x slower and lost end to end (seen failing before: no 'prefill' part).
    from specbench.models.loading import PROBE_GAMMA, time_cpu_dtypes

    seconds = time_cpu_dtypes(weights, repeats=1)
    assert set(seconds) == {"bfloat16", "float32"}
    for parts in seconds.values():
        assert set(parts) == ({"target", "prefill", "round"} | ({"draft"} if weights else set()))
        assert parts["prefill"] > 0
        expected = parts["target"] + PROBE_GAMMA * parts.get("draft", 0.0) + parts["prefill"]
        assert parts["round"] == pytest.approx(expected)


def test_dtype_auto_times_specbench_bf16_kernel_where_it_is_built():
    """The bf16 target is timed in every kernel a `CpuLinear` may run, specbench's own included: without it the probe
    picked fp32 on the AVX2 path of an AMX Xeon, whose compiled step then streamed twice the bytes. Seen failing
    before the fix (no `own` entry)."""
    from specbench.models import cpu_bf16
    from specbench.models.loading import target_kernels

    linears = [torch.nn.Linear(64, 32, bias=False, dtype=torch.bfloat16).requires_grad_(False)]
    kernels = target_kernels("bfloat16", linears)
    assert "gemv" in kernels and ("own" in kernels) == cpu_bf16.available()
    assert set(target_kernels("float32", linears)) == set(target_kernels("bfloat16", linears, "torch")) == {"torch"}
    x = torch.randn(1, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        for name, (kernel,) in kernels.items():
            torch.testing.assert_close(kernel(x), linears[0](x), rtol=2e-2, atol=2e-2, msg=name)


def test_dtype_auto_leaves_a_near_tie_to_bf16():
    # With fp32 drafts on specbench's kernels, the W4A16 rounds came within 1-2% of each other on the AMX
    # Xeon (bf16 10.1 / fp32 10.0 ms, then 10.4 / 11.9): a strict comparison flipped the dtype between runs.
    from specbench.models.kernels import NEAR_TIE as DTYPE_MARGIN
    from specbench.models.loading import pick_dtype

    def rounds(bf16: float, fp32: float) -> dict:
        return {"bfloat16": {"round": bf16}, "float32": {"round": fp32}}

    assert pick_dtype(rounds(10.1, 10.0)) == "bfloat16"
    assert pick_dtype(rounds(10.0, 10.0)) == "bfloat16"
    assert pick_dtype(rounds(12.7, 10.7)) == "float32"  # W8A16 there: fp32's round 16% shorter
    assert pick_dtype(rounds(10.0, 10.0 * DTYPE_MARGIN)) == "bfloat16"  # at the margin: still a tie
    assert pick_dtype(rounds(10.0, 10.0 * DTYPE_MARGIN - 0.01)) == "float32"


@pytest.mark.parametrize("layer_class", ["Int8Linear", "Int4Linear"])
def test_weight_only_layers_pick_their_kernel_per_shape(layer_class):
    from specbench.models import quant

    cls = getattr(quant, layer_class)
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96, bias=False, dtype=torch.bfloat16)
    layer = cls(linear)
    assert layer.kernel_rows in (0, *quant.PROBE_ROWS)  # measured for (96, 64, bf16) on this machine
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        kernel, gemm = layer.kernel(x), layer.gemm(x)
        torch.testing.assert_close(kernel.float(), gemm.float(), rtol=0.05, atol=0.05)  # one weight, two kernels
        layer.kernel_rows = 3
        assert torch.equal(layer(x), kernel)  # 3 rows <= 3: the kernel
        layer.kernel_rows = 2
        assert torch.equal(layer(x), gemm)  # past it: the dequantized GEMM
    assert cls(torch.nn.Linear(64, 96, bias=False, dtype=torch.float64)).kernel_rows == 0  # no kernel for fp64
    fmt = "int4 g128" if layer_class == "Int4Linear" else "int8"  # int4's records name its group (default 128)
    assert quant.kernel_choices(torch.nn.Sequential(layer)) == {f"{fmt} 96x64": 2}


def test_compiled_forward_checks_guards_at_a_shape_it_has_not_met(target, prompts):
    """Met shapes skip dynamo's per-call guard check; a shape warm-up did not compile still goes through
    it: it compiles, is counted, and gives the reference's logits, as do the met shapes after it."""
    lm = StaticLM(target, 64, compile_mode="default")
    lm.warm_up(1, [1])
    ref = CachedLM(target)
    ref.prefill([prompts[0]])
    lm.prefill([prompts[0]])
    for k in (1, 3, 1, 3):
        tokens = torch.tensor([prompts[1][:k]])
        torch.testing.assert_close(lm.feed(tokens), ref.feed(tokens), rtol=1e-5, atol=1e-5)
    assert lm.new_shapes == 1


def test_a_compiled_target_runs_every_verify_width_on_one_graph(target, prompts):
    """k = 1 and one graph for every k >= 2 (k a symbol): a γ sweep compiles the target twice, not once per γ.
    Each width still gives the reference's logits. Seen failing before the fix: one graph per k (3 more here)."""
    from torch._dynamo.utils import counters

    lm = StaticLM(target, 64, compile_mode="default")
    lm.warm_up(1, [1, 2])
    graphs = counters["stats"]["unique_graphs"]
    ref = CachedLM(target)
    ref.prefill([prompts[0]])
    lm.prefill([prompts[0]])
    for k in (3, 5, 7):
        tokens = torch.tensor([prompts[1][:k]])
        torch.testing.assert_close(lm.feed(tokens), ref.feed(tokens), rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == graphs


def test_two_static_lms_of_one_model_keep_their_own_caches(target, prompts):
    """Two compiled StaticLMs of one model and capacity, used in turn, each give the reference's logits over
    its own cache. Seen failing before `compile_cache.own_code`: the second ran the first's graphs, whose
    frozen KV buffers are the first's (dynamo guards them by shape), and its logits were off by up to 5."""
    lms = [StaticLM(target, 64, compile_mode="default") for _ in range(2)]
    refs = [CachedLM(target) for _ in range(2)]
    for lm, ref, prompt in zip(lms, refs, (prompts[0], prompts[3])):
        lm.warm_up(1, [1, 2])
        lm.prefill([prompt])
        ref.prefill([prompt])
    for k in (1, 3, 1, 4):
        for lm, ref, prompt in zip(lms, refs, (prompts[1], prompts[2])):
            tokens = torch.tensor([(prompt * 2)[:k]])
            torch.testing.assert_close(lm.feed(tokens), ref.feed(tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [1, 5, 17])
def test_grouped_attention_equals_transformers_eager_attention(k, dtype):
    """The grouped form (query heads of a group as rows against their one key/value head) gives eager
    attention's output and weights, GQA and an additive mask included. Up to `MAX_QUERY_ROWS` query rows in
    float32 on CPU it is specbench's kernel where that is built (`cpu_matvec.cache_attention`), which returns no
    weights; past them (a prefill), the grouped GEMM."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    from specbench.decoding.attention import grouped_attention
    from specbench.models import cpu_matvec

    kernel = k <= cpu_matvec.MAX_QUERY_ROWS and dtype == torch.float32 and cpu_matvec.available()
    g = torch.Generator().manual_seed(0)
    module = torch.nn.Module().eval()
    module.num_key_value_groups = 3
    q, kv = torch.randn(2, 6, k, 8, generator=g), torch.randn(2, 2, 2, 11, 8, generator=g)
    q, kv = q.to(dtype), kv.to(dtype)
    allowed = torch.rand(2, 1, k, 11, generator=g) > 0.3
    allowed[..., 0] = True
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    out, weights = grouped_attention(module, q, kv[0], kv[1], mask, 0.125)
    ref_out, ref_weights = eager_attention_forward(module, q, kv[0], kv[1], mask, 0.125)
    torch.testing.assert_close(out, ref_out)
    if kernel:
        assert weights is None
    else:  # weights [B, G, r·k, C] are eager's [B, H, k, C], heads of a group stacked as rows
        torch.testing.assert_close(weights.reshape(ref_weights.shape), ref_weights)


def test_grouped_attention_refuses_what_it_does_not_apply():
    from specbench.decoding.attention import grouped_attention

    x = torch.zeros(1, 2, 1, 4)
    with pytest.raises(ValueError, match="softcap"):
        grouped_attention(torch.nn.Module(), x, x[:, :1], x[:, :1], None, 1.0, softcap=30.0)


def test_a_cache_filled_under_another_isa_is_not_reused(tmp_path):
    """Inductor's cache keys leave out the vector ISA: a process forced to AVX2 (`ATEN_CPU_CAPABILITY=avx2`) on an
    AVX-512 machine reused the graphs an unforced process had compiled into the same cache and got NaN logits.
    Both processes here share one TORCHINDUCTOR_CACHE_DIR; the compiled W4A16 forward must match the uncompiled
    one in each (`compile_cache.keyed_cache_dir` gives each ISA its own sub-folder)."""
    import os
    import subprocess
    import sys

    from torch._inductor.cpu_vec_isa import pick_vec_isa

    if str(pick_vec_isa()).strip() in ("avx2", ""):
        pytest.skip("this CPU's own vector ISA is AVX2 (or none): forcing AVX2 changes nothing")
    test = f"{__file__}::test_compiled_w4a16_copy_fuses_its_linears_and_matches_its_static_forward"
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    for capability in (None, "avx2"):
        run_env = env if capability is None else {**env, "ATEN_CPU_CAPABILITY": capability}
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
            env=run_env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, f"ATEN_CPU_CAPABILITY={capability}: {proc.stdout[-1500:]}"
    assert sorted(p.name for p in (tmp_path / "inductor").glob("isa-*")) == [
        "isa-avx2",
        f"isa-{pick_vec_isa()}".replace(" ", "_"),
    ]


@needs_embedded
@pytest.mark.embedded
@pytest.mark.parametrize("forward", ["static", pytest.param("compiled", marks=pytest.mark.slow)])
def test_embedded_pair_fast_path_decodes_the_eager_oracles_greedy_tokens_at_b1_and_b4(forward):
    """The fast path against the eager reference on the real default pair (SmolLM2, float32, n-gram drafts so only
    the target compiles: k = 1 and γ + 1 = 3 at B = 1 and 4). `static` (the fast path's cache, uncompiled) runs in
    every suite; `compiled` is compile-bound (325 s on a loaded 2-core box with a cold cache), so marked slow."""
    import specbench

    questions = ["Name three primary colours.", "Count from one to ten.", "What is 2 + 2?", "Say hello in French."]
    for batch in (questions[:1], questions):
        common = dict(draft="ngram", dtype="float32", max_new_tokens=8, gamma=2)
        eager = specbench.decode(batch, forward="eager", **common)
        fast = specbench.decode(batch, forward=forward, compile_mode="default", **common)
        assert fast.forward == forward and eager.forward == "eager"
        assert fast.tokens == eager.tokens, f"B={len(batch)}"

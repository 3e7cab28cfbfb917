"""The GPU path: host syncs per round, KV-cache host mirrors, the own attention mask, job
telemetry and shape-only labelling (CPU), and on CUDA: event timing, telemetry, greedy
equality and the sync count measured by torch's sync debug mode (`-m gpu`, skipped without CUDA).
"""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import VOCAB, perturbed, tiny_llama

from specbench.bench import runstore
from specbench.bench.job import run_job
from specbench.bench.telemetry import JobTelemetry
from specbench.config import Config, DraftConfig, ForwardConfig, ModelConfig, PairConfig, WorkloadConfig
from specbench.decoding import kvcache
from specbench.decoding.decoder import autoregressive_decode, speculative_decode
from specbench.decoding.drafts import ModelDraft, NgramDraft
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.sampling import SamplingConfig, exponential_race, sample
from specbench.decoding.timing import PhaseTimer, host_syncs, to_device, to_host
from specbench.gpu import equality

ROOT = Path(__file__).resolve().parents[1]
GREEDY = SamplingConfig()
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _tiny_cfg(tmp_path: Path, **kw) -> Config:
    pair = PairConfig(
        name="tiny",
        target=ModelConfig(source=None, shape="tiny-llama"),
        draft=ModelConfig(source=None, shape="tiny-llama"),
        dtype="float32",
        device=kw.pop("device", "cpu"),
    )
    workload = kw.pop("workload", WorkloadConfig(name="synthetic", kind="synthetic", prompt_tokens=12, n_prompts=2))
    return Config(
        pair=pair,
        draft=DraftConfig(kind="model"),
        workload=workload,
        gamma=2,
        batch_size=2,
        max_new_tokens=6,
        warmup=0,
        runs_dir=str(tmp_path),
        **{"forward": ForwardConfig(path="eager"), **kw},
    )


# ---------------------------------------------------------------- host syncs (CPU)


def test_to_host_is_one_counted_copy():
    before = host_syncs()
    a, b, c = to_host(torch.tensor([1, 2]), torch.arange(6).reshape(2, 3), torch.tensor(7))
    assert (a, b, c) == ([1, 2], [[0, 1, 2], [3, 4, 5]], 7)
    assert host_syncs() == before + 1
    assert to_device([[1, 2]], "cpu").tolist() == [[1, 2]]


def test_exponential_race_is_multinomial_without_syncs():
    """The CUDA sampler draws exactly what torch.multinomial draws from the same generator."""
    probs = torch.rand(40, 300).pow(4).softmax(-1)
    probs[:, 7] = 0.0  # zeros are never drawn
    for seed in range(10):
        ref = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed)).squeeze(-1)
        race = exponential_race(probs, torch.Generator().manual_seed(seed))
        assert torch.equal(ref, race)
        assert torch.equal(sample(probs, torch.Generator().manual_seed(seed)), ref)


@pytest.mark.parametrize("kind", ["model", "ngram"])
@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(temperature=1.0, top_k=20)], ids=["greedy", "t1k20"])
def test_one_host_sync_per_round_and_mirrors_hold(kind, sampling, target, close_draft, prompts):
    """Every round (ragged batch, EOS, finished rows dropped) makes exactly one counted host
    sync, and after every round the KV caches' host mirrors equal their device masks."""
    target_lm = CachedLM(target)
    draft = ModelDraft(close_draft) if kind == "model" else NgramDraft(VOCAB)

    def check(seqs, rows):
        target_lm.check_mirrors()
        if kind == "model":
            draft.lm.check_mirrors()

    ps = prompts + [[3]]  # a one-token prompt takes the draft's uncache path at prefill
    result = speculative_decode(
        target_lm, draft, ps, 3, sampling, 14, {11}, torch.Generator().manual_seed(0), on_round=check
    )
    assert result.rounds and {r.host_syncs for r in result.rounds} == {1}
    ar = autoregressive_decode(CachedLM(target), ps, sampling, 8, set(), torch.Generator().manual_seed(0))
    assert {r.host_syncs for r in ar.rounds} == {1}


def test_mirrors_under_random_cache_operations(target):
    """Host mirrors track the mask through feeds, rollbacks, un-caching, row selection, compaction."""
    lm = CachedLM(target)
    g = torch.Generator().manual_seed(3)
    lm.prefill([[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11]])
    lm.check_mirrors()
    for _step in range(40):
        batch = len(lm.n_valid_host)
        op = int(torch.randint(0, 4, (1,), generator=g))
        if op <= 1:
            k = int(torch.randint(1, 5, (1,), generator=g))
            lm.feed(torch.randint(0, VOCAB, (batch, k), generator=g))
            keep = torch.randint(0, k + 1, (batch,), generator=g)
            lm.keep_last_fed(k, keep) if op == 0 else lm.keep_last_fed(k, keep, keep.tolist())
        elif op == 2:
            lm.uncache_last([min(int(torch.randint(0, 3, (1,), generator=g)), n) for n in lm.n_valid_host])
        elif batch > 1:
            rows = sorted(torch.randperm(batch, generator=g)[: batch - 1].tolist())
            lm.select_rows(rows)
        lm.check_mirrors()
    assert lm.mask.shape[1] <= 2 * max(lm.n_valid_host) + 16  # holes were compacted away


def test_uncache_more_than_cached_is_an_error(target):
    lm = CachedLM(target)
    lm.prefill([[1, 2], [3]])
    with pytest.raises(ValueError, match="row 1 has 1 cached tokens, asked to drop 2"):
        lm.uncache_last([0, 2])


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_own_4d_mask_equals_transformers_mask(impl, monkeypatch, prompts):
    """The 4D mask built in CachedLM (no host sync) gives the logits transformers' own mask gives."""
    model = tiny_llama(0)
    model.set_attn_implementation(impl)
    assert model.config._attn_implementation == impl

    def run() -> list[torch.Tensor]:
        lm, out = CachedLM(model), []
        lm.prefill(prompts)
        g = torch.Generator().manual_seed(1)
        for keep in ([1, 3, 0, 2], [2, 2, 1, 0], [3, 1, 3, 3]):
            out.append(lm.feed(torch.randint(0, VOCAB, (4, 3), generator=g)))
            lm.keep_last_fed(3, keep)
            out.append(lm.feed(torch.randint(0, VOCAB, (4, 1), generator=g)))
        return out

    own = run()
    monkeypatch.setattr(kvcache, "_OWN_MASK", ())  # 2D mask: transformers builds the 4D one
    theirs = run()
    for a, b in zip(own, theirs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_timer_marks_resolve_on_cpu():
    timer = PhaseTimer("cpu")
    marks = [timer.mark() for _ in range(3)]
    seconds = timer.resolve()
    assert marks == [0, 1, 2] and seconds[0] == 0.0 and seconds == sorted(seconds)


# ---------------------------------------------------------------- jobs: telemetry, shape-only (CPU)


def test_cpu_job_records_telemetry_as_not_applicable(tmp_path):
    job = tmp_path / "job"
    assert run_job(_tiny_cfg(tmp_path), job)
    tel = json.loads((job / "telemetry.json").read_text())
    assert tel["available"] is False and "not applicable" in tel["reason"] and tel["calls"] == []
    done = json.loads((job / "done.json").read_text())
    assert done["telemetry"] == {"available": False, "reason": tel["reason"]}
    assert done["shape_only"] is True
    samples = pd.read_parquet(job / "telemetry.parquet")
    assert samples.empty and {"power_w", "energy_j", "decoder"} <= set(samples.columns)
    rounds = pd.read_parquet(job / "rounds.parquet")
    assert rounds["shape_only"].all() and set(rounds["host_syncs"]) == {1}
    requests = pd.read_parquet(job / "requests.parquet")
    assert requests["shape_only"].all()


def test_shape_only_pair_needs_a_synthetic_workload(tmp_path):
    cfg = _tiny_cfg(tmp_path, workload=WorkloadConfig())  # the built-in text prompts
    with pytest.raises(ValueError, match=r"workload.kind='builtin' needs a tokenizer.*shape-only.*workload=synthetic"):
        run_job(cfg, tmp_path / "job")
    failure = json.loads((tmp_path / "job" / "failure.json").read_text())
    assert "workload=synthetic" in failure["message"]
    assert not (tmp_path / "job" / "rounds.parquet").exists()


def test_job_telemetry_without_nvml_is_recorded_not_raised(tmp_path):
    """A CUDA job on a machine whose NVML is unusable: recorded as unavailable, with the reason."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here: the unavailable path cannot be exercised")
    except pytest.skip.Exception:
        raise
    except Exception:
        pass

    class Result:
        requests = []

    tel = JobTelemetry("cuda:0", interval_s=0.01)
    tel.run(lambda: Result(), decoder="speculative", repeat=0, batch=0)
    meta = tel.write(tmp_path)
    assert meta["available"] is False and ("NVML" in meta["reason"] or "pynvml" in meta["reason"])
    assert json.loads((tmp_path / "telemetry.json").read_text())["calls"][0]["available"] is False


def test_job_telemetry_aggregates_per_decoder(tmp_path):
    """Per-decoder energy per generated token from per-call summaries (no GPU needed)."""
    tel = JobTelemetry("cpu")
    tel.reason = None  # as on a CUDA job
    call = {
        "available": True,
        "device_name": "GPU",
        "device_index": 0,
        "energy_source": "counter",
        "power_max_w": 300.0,
        "sm_util_mean_pct": 50.0,
        "mem_util_mean_pct": 20.0,
        "sm_clock_mean_mhz": 1900.0,
        "mem_used_max_bytes": 1e9,
    }
    tel.calls = [
        {
            **call,
            "decoder": "autoregressive",
            "energy_j": 10.0,
            "new_tokens": 100,
            "duration_s": 0.1,
            "power_mean_w": 100.0,
        },
        {
            **call,
            "decoder": "autoregressive",
            "energy_j": 30.0,
            "new_tokens": 100,
            "duration_s": 0.3,
            "power_mean_w": 200.0,
        },
        {
            **call,
            "decoder": "speculative",
            "energy_j": 12.0,
            "new_tokens": 200,
            "duration_s": 0.1,
            "power_mean_w": 120.0,
        },
    ]
    meta = tel.write(tmp_path)
    s = json.loads((tmp_path / "telemetry.json").read_text())
    ar = s["decoders"]["autoregressive"]
    assert ar["energy_j"] == 40.0 and ar["new_tokens"] == 200 and ar["energy_per_token_j"] == pytest.approx(0.2)
    assert ar["power_mean_w"] == pytest.approx((100 * 0.1 + 200 * 0.3) / 0.4)
    assert s["energy_per_token_j"] == pytest.approx(52.0 / 400)
    assert meta["energy_per_token_j_by_decoder"] == {
        "autoregressive": pytest.approx(0.2),
        "speculative": pytest.approx(0.06),
    }


# ---------------------------------------------------------------- the check script (CPU)


def test_divergence_reports_margins(target, prompts):
    ar = autoregressive_decode(CachedLM(target), prompts[:1], GREEDY, 6, set()).tokens[0]
    assert equality.divergence(target, target, prompts[0], ar, list(ar), torch.float64) is None
    other = list(ar)
    other[3] = (ar[3] + 1) % VOCAB
    d = equality.divergence(target, target, prompts[0], ar, other, torch.float64)
    assert d["position"] == 3 and d["ar_token"] == ar[3] and d["fp32_argmax"] == ar[3]
    assert d["margin_fp32"] > 0 and d["tie"] is (d["margin_fp32"] <= equality.FP32_TIE)


def test_gpu_check_cpu_smoke(tmp_path):
    """scripts/gpu_check.sh --cpu-smoke runs every step end to end on tiny shapes (~1 min): the plumbing the GPU
    run depends on (install check, pytest -m gpu, sweep + summary, report, fast path, equality) cannot rot."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "gpu_check.sh"),
            "--cpu-smoke",
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    steps = json.loads((out / "steps.json").read_text())
    assert steps["ok"] and [s["step"] for s in steps["steps"]] == [
        "env",
        "install",
        "pytest",
        "sweep",
        "report",
        "fastpath",
        "equality",
    ]
    assert json.loads((out / "greedy_equality.json").read_text())["ok"]
    files = {p.name for p in out.iterdir()}
    expected = {"gpu_check.log", "steps.json", "pytest_gpu.txt", "report.md", "ct.csv", "fastpath.json"}
    assert expected | {"greedy_equality.json", "results.tar.gz"} == files  # the device tool returns 8 files at most
    fast = json.loads((out / "fastpath.json").read_text())
    assert all(c["same_tokens"] and c["new_shapes_while_timed"] == 0 for c in fast["cases"]) and len(fast["cases"]) == 2
    rounds = runstore.load_sweep(tmp_path / "work" / "runs" / "gpu_check", "rounds")
    assert set(rounds["host_syncs"]) == {1} and rounds["shape_only"].all()


# ---------------------------------------------------------------- CUDA


@pytest.mark.gpu
@cuda
def test_cuda_event_timing_without_host_sync():
    timer = PhaseTimer("cuda")
    a = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a mark must never sync
    try:
        m0 = timer.mark()
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        m1 = timer.mark()
        x = to_device([[1, 2, 3]], "cuda")  # async copy from pinned memory: no sync either
        m2 = timer.mark()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    seconds = timer.resolve()
    assert seconds[m1] - seconds[m0] > 0 and seconds[m2] >= seconds[m1]
    assert x.tolist() == [[1, 2, 3]]


def _sync_warnings(records) -> list[str]:
    return [f"{Path(w.filename).name}:{w.lineno}" for w in records if "synchronizing" in str(w.message)]


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("kind", ["model", "ngram"])
@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(temperature=1.0, top_p=0.9)], ids=["greedy", "t1p09"])
def test_cuda_one_sync_per_round(kind, sampling):
    """torch's sync debug mode sees exactly one host sync per round (the accepted counts)."""
    target = tiny_llama(0, dtype=torch.float32).cuda()
    draft = (
        ModelDraft(perturbed(tiny_llama(0, dtype=torch.float32), 0.3, 1).cuda())
        if kind == "model"
        else NgramDraft(VOCAB, device="cuda")
    )
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (6, 11, 3, 17)]
    seen: list[int] = []
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = speculative_decode(
                CachedLM(target),
                draft,
                prompts,
                3,
                sampling,
                16,
                set(),
                torch.Generator("cuda").manual_seed(0),
                on_round=lambda seqs, rows: seen.append(len(_sync_warnings(records))),
            )
        finally:
            torch.cuda.set_sync_debug_mode("default")
    per_round = [b - a for a, b in zip(seen, seen[1:])]  # from one round's commit to the next's
    where = _sync_warnings(records)
    assert per_round and set(per_round) == {1}, f"syncs per round {per_round}; sync sites: {sorted(set(where))}"
    assert {r.host_syncs for r in result.rounds} == {1}


@pytest.mark.gpu
@cuda
def test_cuda_greedy_equality_fp32():
    """Speculative == autoregressive == transformers' greedy, fp32 on CUDA (tiny models)."""
    target = tiny_llama(0, dtype=torch.float32).cuda()
    draft = perturbed(tiny_llama(0, dtype=torch.float32), 0.3, 1).cuda()
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (6, 11, 3, 17)]
    ar = autoregressive_decode(CachedLM(target), prompts, GREEDY, 24, set()).tokens
    for gamma in (1, 4):
        spec = speculative_decode(CachedLM(target), ModelDraft(draft), prompts, gamma, GREEDY, 24, set())
        assert spec.tokens == ar
        assert 0 < sum(r.accepted for r in spec.rounds)
    for p, a in zip(prompts, ar):
        x = torch.tensor([p], device="cuda")
        hf = target.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=24,
            min_new_tokens=24,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        assert hf[0, len(p) :].tolist() == a


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_half_precision_decodes_and_reports_margins(dtype):
    """bf16/fp16 on CUDA: decoding runs; any greedy divergence is at a near-tie in fp32."""
    ref = tiny_llama(0, dtype=torch.float32).cuda()
    model = tiny_llama(0, dtype=torch.float32).to(getattr(torch, dtype))
    draft = perturbed(model, 0.3, 1).cuda()  # conftest's noise is drawn on the CPU
    model = model.cuda()
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (6, 11, 3, 17)]
    ar = autoregressive_decode(CachedLM(model), prompts, GREEDY, 24, set()).tokens
    spec = speculative_decode(CachedLM(model), ModelDraft(draft), prompts, 4, GREEDY, 24, set())
    assert all(len(t) == 24 for t in spec.tokens) and {r.host_syncs for r in spec.rounds} == {1}
    for p, a, s in zip(prompts, ar, spec.tokens):
        d = equality.divergence(model, ref, p, a, s, getattr(torch, dtype))
        if d is not None:
            print(f"{dtype}: diverged at {d['position']}, fp32 margin {d['margin_fp32']:.4f}")
            assert abs(d["margin_fp32"]) <= 1.0, d  # a bug diverges at confident tokens, not near-ties


@pytest.mark.gpu
@cuda
def test_cuda_job_records_telemetry(tmp_path):
    """A CUDA job samples NVML during measured decoding: per-decoder energy per token."""
    job = tmp_path / "job"
    assert run_job(_tiny_cfg(tmp_path, device="cuda"), job)
    tel = json.loads((job / "telemetry.json").read_text())
    assert tel["available"] is True, tel
    for decoder in ("autoregressive", "speculative"):
        block = tel["decoders"][decoder]
        assert block["new_tokens"] > 0 and block["energy_j"] is not None and block["energy_j"] >= 0
    samples = pd.read_parquet(job / "telemetry.parquet")
    assert len(samples) >= 2 * len(tel["calls"]) and set(samples["decoder"]) == {"autoregressive", "speculative"}
    done = json.loads((job / "done.json").read_text())
    assert done["telemetry"]["available"] is True and done["hardware"].startswith("cuda:")
    rounds = pd.read_parquet(job / "rounds.parquet")
    assert set(rounds["host_syncs"]) == {1}


# ---------------------------------------------------------------- CUDA paths checked on CPU


def test_peak_memory_reads_the_jobs_device(monkeypatch):
    """A job on cuda:1 resets and reads cuda:1's peak, not the current device's (cuda:0)."""
    from specbench.bench import memory

    seen = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: seen.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: seen.append(("max", device)) or 7)
    with memory.PeakMemory("cuda:1") as peak:
        pass
    assert [(what, str(dev)) for what, dev in seen] == [("reset", "cuda:1"), ("max", "cuda:1")]
    assert peak.record["peak_cuda_bytes"] == 7


def test_draft_auto_on_cuda_skips_kinds_without_a_kernel():
    """On a device where a weight-only format has no kernel, its layers would dequantize every weight every call:
    `auto` skips such kinds, a named one is refused with the reason, and jobs record what was skipped."""
    from specbench.models import quant
    from specbench.models.draft_kinds import DRAFT_KINDS, device_refusal, resolve_kind

    missing = {f: quant.cuda_kernel_missing(f, torch.bfloat16) for f in ("int8", "int4")}
    usable = [k for k in DRAFT_KINDS.names() if all(not missing[f] for f in DRAFT_KINDS.get(k).formats)]
    chosen = resolve_kind("auto", "cuda")
    assert chosen in usable and DRAFT_KINDS.get(chosen).formats == () or not missing[DRAFT_KINDS.get(chosen).weights]
    assert DRAFT_KINDS.get("w4a16h8").formats == ("int4", "int8")
    for kind in DRAFT_KINDS.names():
        reason = device_refusal(kind, "cuda:0", "bfloat16")
        assert device_refusal(kind, "cpu") is None
        if reason:
            with pytest.raises(ValueError, match=f"draft.kind='{kind}' on cuda"):
                resolve_kind(kind, "cuda")
    if missing["int4"]:  # a CPU build of torch: no CUDA kernels at all
        assert "no CUDA kernel" in device_refusal("w4a16", "cuda") and resolve_kind("auto", "cuda") == "ngram"
    assert "takes ['bfloat16'] activations, not float32" in quant.cuda_kernel_missing("int4", torch.float32)


def test_int4_cuda_packing_has_tinygemms_shapes():
    """The CUDA int4 path packs with tinygemm's op (not the CPU-only `_for_cpu` one), shapes checked on meta."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from specbench.models import quant

    n, k = 64, 256
    with FakeTensorMode():
        q = torch.empty(n, k, dtype=torch.uint8, device="meta")
        packed = quant.pack_int4_for_cuda(q)
        assert packed.shape == (n // 8, k // (quant.INT4_INNER_K_TILES * 16), 32, quant.INT4_INNER_K_TILES // 2)
        sz = torch.empty(k // 32, n, 2, dtype=torch.bfloat16, device="meta")
        x = torch.empty(3, k, dtype=torch.bfloat16, device="meta")
        assert torch.ops.aten._weight_int4pack_mm(x, packed, 32, sz).shape == (3, n)


# ---------------------------------------------------------------- CUDA: weight-only drafts and the fast path


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_cuda_weight_only_layer_runs_its_kernel(kind):
    """Each weight-only format on CUDA either runs torch's kernel (equal to its dequantized GEMM, fewer bytes than
    bf16) or is refused by name; never a crash in a CPU-only op."""
    from specbench.models import quant

    reason = quant.cuda_kernel_missing(kind, torch.bfloat16)
    linear = torch.nn.Linear(512, 256, bias=False, dtype=torch.bfloat16, device="cuda")
    layer = quant.WEIGHT_ONLY_LAYERS[kind](linear)
    print(f"{kind}: source {layer.source}, rows {layer.kernel_rows}, missing: {reason}")
    if reason:
        assert layer.source is None and layer.kernel_rows == 0
        return
    assert layer.source == "torch" and layer.kernel_rows > 0
    x = torch.randn(4, 512, dtype=torch.bfloat16, device="cuda")
    torch.testing.assert_close(layer.kernel(x).float(), layer.gemm(x).float(), atol=0.05, rtol=0.02)
    kernel_bytes = sum(b.numel() * b.element_size() for b in layer.buffers())
    assert kernel_bytes < linear.weight.numel() * linear.weight.element_size()


@pytest.mark.gpu
@cuda
def test_cuda_fast_path_greedy_equal_no_new_shapes_one_sync_per_round():
    """The compiled fast path on CUDA (static KV, CUDA graphs): greedy tokens equal the eager oracle's, no shape is
    compiled while decoding after warm-up, and torch's sync debug mode sees one host sync per round."""
    from specbench.decoding.forward import ForwardPath, capacity_for, target_ks

    target = tiny_llama(0, dtype=torch.float32).cuda()
    draft = perturbed(tiny_llama(0, dtype=torch.float32), 0.3, 1).cuda()
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (6, 11, 3, 17)]
    ar = autoregressive_decode(CachedLM(target), prompts, GREEDY, 24, set()).tokens
    gamma = 3
    path = ForwardPath("compiled", "reduce-overhead", capacity_for([17], 24, gamma))
    path.warm_up(target, len(prompts), target_ks(gamma))
    path.warm_up(draft, len(prompts), [1, 2])
    seen: list[int] = []
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            lm = path.lm(target)
            spec = speculative_decode(
                lm,
                ModelDraft(draft, lm=path.lm(draft)),
                prompts,
                gamma,
                GREEDY,
                24,
                set(),
                on_round=lambda seqs, rows: seen.append(len(_sync_warnings(records))),
            )
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert spec.tokens == ar
    assert path.new_shapes(target, draft) == 0
    per_round = [b - a for a, b in zip(seen, seen[1:])]
    assert per_round and set(per_round) == {1}, f"syncs per round {per_round}: {sorted(set(_sync_warnings(records)))}"
    fast_ar = autoregressive_decode(path.lm(target), prompts, GREEDY, 24, set()).tokens
    assert fast_ar == ar


@pytest.mark.gpu
@cuda
def test_cuda_peak_memory_on_the_jobs_device():
    from specbench.bench.memory import PeakMemory

    with PeakMemory("cuda:0") as peak:
        x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda:0")
    del x
    assert peak.record["peak_cuda_bytes"] >= 64 << 20


def test_requirements_hold_on_the_gpu_image_with_the_carried_wheels():
    """Every requirement of specbench is either carried as a wheel or met by the GPU image's own version: the install
    on the GPU machine failed while specbench asked for transformers >= 5.24 (the image has 5.17, and a newer one
    needs a huggingface_hub the image lacks)."""
    import tomllib
    from packaging.requirements import Requirement

    from specbench.gpu import wheels

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    carried = {n.replace("_", "-") for n in wheels.MISSING_ON_IMAGE}
    for dep in map(Requirement, deps):
        name = dep.name.lower().replace("_", "-")
        if name in carried or name not in wheels.IMAGE_VERSIONS:
            continue
        assert dep.specifier.contains(wheels.IMAGE_VERSIONS[name], prereleases=True), (str(dep), "image has", name)
    assert "transformers" not in carried and "huggingface-hub" not in carried  # the image's own stay
    pins = dict(p.split("==") for p in wheels.pins() if "==" in p)
    assert set(pins) <= carried

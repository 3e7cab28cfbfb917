"""`python -m specbench.audit`: audit decoders on a pair, write audit.md / audit.csv, exit 1 on any FAIL."""

from __future__ import annotations

import argparse
import dataclasses
from contextlib import ExitStack

from specbench.audit.names import DECODER_CHOICES, check_decoder_name, is_llama_cpp
from specbench.audit.settings import DEFAULT_DECODER, MINIMUMS, REFERENCE_SAMPLES_MIN, REFERENCES, AuditSettings
from specbench.cli_errors import ArgumentParser, int_at_least


def _ids(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(",") if t.strip())


def _parse_ids(text: str) -> tuple[int, ...]:
    try:
        return _ids(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated token ids, e.g. 5,7") from exc


def _parse_sequences(text: str) -> tuple[tuple[int, ...], ...]:
    try:
        return tuple(_ids(seq) for seq in text.split(";") if seq.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected token-id sequences like 1,2;3,4,6") from exc


def _parse_sampling(text: str) -> tuple[float, int, float]:
    parts = text.split(":")
    try:
        if not 1 <= len(parts) <= 3:
            raise ValueError("expected 1 to 3 fields")
        return float(parts[0]), int(parts[1]) if len(parts) > 1 else 0, float(parts[2]) if len(parts) > 2 else 1.0
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--sampling {text!r}: expected T[:top_k[:top_p]], e.g. 1.0:50:1.0") from exc


def build_parser() -> argparse.ArgumentParser:
    """The CLI's arguments: pair, decoders, sampling (processors included) and audit settings."""
    parser = ArgumentParser(
        prog="python -m specbench.audit",
        description="Lossless audit: does a decoder preserve the target's output distribution? "
        "Exits 1 when any audit fails.",
    )
    parser.add_argument("--pair", default="tiny", choices=["tiny", "embedded"])
    parser.add_argument(
        "--decoder", action="append", help=f"{DECODER_CHOICES}; repeat for several (default {DEFAULT_DECODER})"
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--repetition-penalty", type=float, default=1.0, help="transformers' semantics (prompt too)")
    parser.add_argument("--frequency-penalty", type=float, default=0.0, help="OpenAI semantics (generated tokens)")
    parser.add_argument("--presence-penalty", type=float, default=0.0, help="OpenAI semantics (generated tokens)")
    parser.add_argument("--banned-token-ids", type=_parse_ids, default=(), metavar="ID,ID")
    parser.add_argument("--banned-sequences", type=_parse_sequences, default=(), metavar="ID,ID;ID,ID,ID")
    parser.add_argument(
        "--sampling",
        action="append",
        type=_parse_sampling,
        metavar="T[:K[:P]]",
        help="extra sampling configs (repeatable, same penalties and bans), e.g. --sampling 1.0:50",
    )
    parser.add_argument("--gamma", type=int_at_least(1), default=2)
    d = AuditSettings()
    count = lambda name: int_at_least(MINIMUMS[name])  # noqa: E731 (AuditSettings' own bounds)
    parser.add_argument("--samples", type=count("samples"), default=d.samples, help="continuations per prompt")
    parser.add_argument(
        "--reference-samples",
        type=int_at_least(REFERENCE_SAMPLES_MIN),
        default=None,
        help="sample mode: reference continuations",
    )
    parser.add_argument("--tokens", type=count("tokens"), default=d.tokens)
    parser.add_argument("--reference", default=d.reference, choices=REFERENCES)
    parser.add_argument("--max-enumerate", type=count("max_enumerate"), default=d.max_enumerate)
    parser.add_argument("--prompts", type=int_at_least(1), default=None, help="use only the first N built-in prompts")
    parser.add_argument("--alpha", type=float, default=d.alpha)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--batch-size", type=count("batch_size"), default=d.batch_size)
    parser.add_argument("--threads", type=int_at_least(1), default=None, help="torch.set_num_threads")
    parser.add_argument("--out", default="runs/audit")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the audits the arguments ask for; 0 when all pass, 1 when any fails."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings, decoders, llama = check_arguments(args)
    except ValueError as exc:
        parser.error(str(exc))
    # torch, transformers and the models load only once the arguments are known to be good: a bad one is a
    # one-line error at once, not after seconds of imports.
    import torch

    from specbench.audit.core import TooFewSamplesError
    from specbench.audit.pairs import AUDIT_PROMPTS, load_audit_pair
    from specbench.decoding.sampling import SamplingConfig

    try:
        base = SamplingConfig(
            args.temperature,
            args.top_k,
            args.top_p,
            args.min_p,
            args.repetition_penalty,
            args.frequency_penalty,
            args.presence_penalty,
            args.banned_token_ids,
            args.banned_sequences,
        )
        samplings = [base] + [
            dataclasses.replace(base, temperature=t, top_k=k, top_p=p) for t, k, p in args.sampling or []
        ]
        built_in = len(AUDIT_PROMPTS[args.pair])
        if args.prompts is not None and args.prompts > built_in:
            raise ValueError(
                f"argument --prompts: {args.prompts}: must be at most {built_in} "
                f"(the {built_in} built-in prompts of --pair {args.pair})"
            )
    except ValueError as exc:
        parser.error(str(exc))
    if args.threads:
        torch.set_num_threads(args.threads)
    target, draft, prompts, eos = load_audit_pair(args.pair)
    try:
        for sampling in samplings:
            sampling.check_vocab(target.config.vocab_size)
    except ValueError as exc:
        parser.error(f"argument --banned-token-ids/--banned-sequences: {exc}")
    if args.prompts:
        prompts = prompts[: args.prompts]
    try:
        return _run(args, settings, samplings, decoders, llama, target, draft, prompts, eos)
    except TooFewSamplesError as exc:
        parser.error(f"argument --samples: {args.samples} with --tokens {args.tokens}: {exc}")


def check_arguments(args: argparse.Namespace) -> tuple[AuditSettings, list[str], list[str]]:
    """(settings, decoder names, the llama.cpp ones among them), or a ValueError naming the bad argument; without
    torch."""
    settings = AuditSettings(
        samples=args.samples,
        tokens=args.tokens,
        alpha=args.alpha,
        reference=args.reference,
        reference_samples=args.reference_samples,
        max_enumerate=args.max_enumerate,
        batch_size=args.batch_size,
        seed=args.seed,
    )
    decoders = args.decoder or [DEFAULT_DECODER]
    for name in decoders:
        check_decoder_name(name)
    llama = [n for n in decoders if is_llama_cpp(n)]
    if llama and args.pair != "embedded":
        raise ValueError(f"--decoder {llama[0]}: llama.cpp runs GGUF copies of the embedded model; use --pair embedded")
    if llama and args.reference == "exact":
        raise ValueError("--reference exact: llama.cpp decoders are audited against llama.cpp's own sampling")
    return settings, decoders, llama


def _run(args, settings, samplings, decoders, llama, target, draft, prompts, eos) -> int:
    """Every (sampling, decoder) audit, printed as it ends; audit.md and audit.csv; 0 when all pass."""
    from specbench.audit.core import run_audit
    from specbench.audit.decoders import make_decoder
    from specbench.audit.result import AuditResult

    results, cache = [], {}
    with ExitStack() as stack:
        la = None
        if llama:
            from specbench.audit.llama_cpp import LlamaCppAudit

            la = stack.enter_context(LlamaCppAudit(llama, args.gamma, threads=args.threads or 1))
        for sampling in samplings:
            for name in decoders:
                if name in llama:  # reference: llama.cpp's own plain sampling of the same GGUF
                    decoder, ref = la.decoder(name, sampling), la.reference(sampling)
                    s = dataclasses.replace(settings, reference="sample")
                    result = run_audit(target, decoder, prompts, sampling, eos, s, reference=ref, cache=cache)
                else:
                    decoder = make_decoder(name, target, draft, args.gamma, sampling, eos, settings)
                    result = run_audit(target, decoder, prompts, sampling, eos, settings, cache=cache)
                row = result.summary.iloc[0]
                print(
                    f"{row.decoder:>28} {row.sampling:<16} p={row.p_value:.3g} tv={row.tv:.3f} "
                    f"[{row.tv_lo:.3f}, {row.tv_hi:.3f}] detectable_tv={row.detectable_tv:.3f} {row.verdict} "
                    f"({row.seconds:.0f} s)",
                    flush=True,
                )
                results.append(result)
    result = AuditResult.concat(results)
    out = result.save(args.out)
    print(f"wrote {out / 'audit.md'} and {out / 'audit.csv'}: {'PASS' if result.passed else 'FAIL'}")
    return 0 if result.passed else 1

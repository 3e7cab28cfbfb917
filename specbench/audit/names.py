"""The audit's decoder names (`--decoder`, `audit.decoder`): which engines and variants it audits and how a name
reads. Without torch, so the CLI checks its arguments before it loads a model."""

from __future__ import annotations

from specbench.decoding.policies import POLICIES
from specbench.decoding.records import AUTOREGRESSIVE, HF_ASSISTED, LLAMA_CPP, LLAMA_CPP_AUTOREGRESSIVE, SPECULATIVE
from specbench.engines import SERVER, runs_in

# The engines the audit samples from (`specbench.engines`), each with the `:<variant>`s it takes ("" = none):
# speculative:<path>: specbench's decoder on the fast path (`specbench.decoding.forward`; compiled: inductor
# default; auto: as `forward_choice` resolves it, named by what ran); llama.cpp's run through llama-server (`specbench.audit.llama_cpp`; reference: its own plain decoding).
AUDITED = {
    SPECULATIVE: ("", "auto", "static", "compiled"),
    AUTOREGRESSIVE: ("",),
    HF_ASSISTED: ("",),
    LLAMA_CPP: ("", "probabilistic"),
    LLAMA_CPP_AUTOREGRESSIVE: ("",),
}
# Audit-only names: the speculative decoder broken on purpose, or under a draft-length policy.
BROKEN, POLICY = "broken", "policy"
# Where `@<value>` is an engine's own draft-length policy: hf_assisted's assistant_confidence_threshold,
# llama.cpp probabilistic drafting's --spec-draft-p-min.
WITH_AT = {(HF_ASSISTED, ""): "<assistant_confidence_threshold>", (LLAMA_CPP, "probabilistic"): "<--spec-draft-p-min>"}
DECODER_NAMES = tuple(f"{e}:{v}" if v else e for e, variants in AUDITED.items() for v in variants)
DECODER_CHOICES = (
    " | ".join(DECODER_NAMES)
    + f" | {BROKEN}:<variant> | {POLICY}:<draft policy>[@tau] | "
    + " | ".join(f"{e}{':' + v if v else ''}@{what}" for (e, v), what in WITH_AT.items())
)
POLICY_TAU = 0.3  # policy:<name> without @tau


def split_name(name: str) -> tuple[str, str, str]:
    """'llama_cpp:probabilistic@0.5' -> ('llama_cpp', 'probabilistic', '0.5'); 'hf_assisted' -> ('hf_assisted', '', '')."""
    head, _, at = name.partition("@")
    base, _, variant = head.partition(":")
    return base, variant, at


def policy_spec(name: str) -> tuple[str, float]:
    """'policy:prune_naive@0.3' -> ('prune_naive', 0.3): the speculative decoder under a draft-length policy
    (any of `POLICIES`, the audit-only broken one included), with its threshold tau."""
    policy, _, tau = name.removeprefix("policy:").partition("@")
    POLICIES.get(policy, "audit.decoder policy")
    try:
        value = float(tau) if tau else POLICY_TAU
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"audit.decoder={name!r}: tau {tau!r} must be a probability in [0, 1]")
    return policy, value


def is_llama_cpp(name: str) -> bool:
    """A decoder the audit runs as llama-server requests (`specbench.audit.llama_cpp`)."""
    base, variant, _ = split_name(name)
    return base in AUDITED and variant in AUDITED[base] and runs_in(base, SERVER)


def llama_cpp_p_min(name: str) -> float:
    """`llama_cpp:probabilistic@<p>`'s --spec-draft-p-min (0 without one): llama.cpp's own draft-length policy."""
    if "@" not in name:
        return 0.0
    text = name.partition("@")[2]
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"audit.decoder={name!r}: --spec-draft-p-min {text!r} must be a number in [0, 1]")
    return value


def check_decoder_name(name: str) -> None:
    """A ValueError naming the choices unless `name` is a decoder the audit can build."""
    base, variant, at = split_name(name)
    if base == BROKEN:
        from specbench.audit.variants import get_variant  # the variants are torch functions

        get_variant(name.removeprefix(f"{BROKEN}:"))
    elif base == POLICY:
        policy_spec(name)
    elif base in AUDITED and variant in AUDITED[base] and (not at or (base, variant) in WITH_AT):
        if at and runs_in(base, SERVER):
            llama_cpp_p_min(name)
        elif at:
            policy_spec(f"{POLICY}:confidence_stop@{at}")
    else:
        raise ValueError(f"audit.decoder={name!r}: must be {DECODER_CHOICES}")

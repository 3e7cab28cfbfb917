"""A draft-length policy (`draft.policy`, `draft.tau`) on each engine's own knobs, or the sentence saying
the engine has none: a value an engine will not read is never written.

The knobs, read off each engine's documentation and source:
* transformers: `assistant_confidence_threshold` stops the assistant after a token whose probability is
  below it, keeping that token (`confidence_stop`); `num_assistant_tokens_schedule="heuristic"` is the
  +2 / -1 rule (`schedule`). Nothing drops a drafted token.
* llama.cpp: `--spec-draft-p-min` stops drafting at position i, without x_i, when the draft's *top*
  probability max_v q_i(v) is below it (common/speculative.cpp, draft-simple: `cur_p->data[0].p < p_min` on
  the candidates sorted by p, in the probabilistic `--spec-draft-sampling` mode too). It reads q_i, not the
  sampled token, so it is a decision taken before sampling: lossless (audited at T = 1,
  analysis/draft_policies/). It stands for `confidence_stop` (which reads q(x_i) and keeps x_i) approximately. No schedule knob.
* vLLM (`--speculative-config`) and SGLang (`--speculative-*`): no per-token confidence threshold and no
  per-request schedule of γ (vLLM's dynamic speculative decoding varies γ per batch size, written apart).
"""

from __future__ import annotations

from specbench.decoding.policies import POLICIES


def _policy(name: str):
    return POLICIES.get(name, "draft.policy")


def transformers_fields(name: str, tau: float) -> tuple[dict, list[str]]:
    """Assistant generation_config fields for the policy, and the notes."""
    p = _policy(name)
    fields = {
        "num_assistant_tokens_schedule": "heuristic" if p.adapt is not None else "constant",
        "assistant_confidence_threshold": tau if p.stop_after is not None else 0.0,
    }
    notes = []
    if p.drop is not None:
        notes.append(
            f"draft.policy={name} (tau={tau:g}) drops a drafted token on its own probability: transformers has no "
            "such knob, so this config drafts γ with no confidence stop (assistant_confidence_threshold 0)."
        )
    return fields, notes


def llama_cpp_p_min(name: str, tau: float) -> tuple[float, list[str]]:
    """`--spec-draft-p-min` for the policy, and the notes."""
    p = _policy(name)
    notes = []
    if p.adapt is not None:
        notes.append(f"draft.policy={name}: llama.cpp has no schedule of γ; this command drafts up to γ per round.")
    if p.stop_after is not None:
        notes.append(
            f"--spec-draft-p-min {tau:g} stands for draft.policy={name} approximately: llama.cpp stops before position i "
            "when the draft's top probability there is below it, while confidence_stop keeps x_i and stops when q(x_i) "
            "is below tau."
        )
    return (tau if p.reads_confidence else 0.0), notes


def no_knob(engine: str, name: str, tau: float) -> list[str]:
    """The note for an engine without a draft-length knob (empty for `fixed`, which needs none)."""
    p = _policy(name)
    if not (p.reads_confidence or p.adapt is not None):
        return []
    return [
        f"draft.policy={name} (tau={tau:g}): {engine} has no knob for a draft-length policy (no per-token draft "
        "confidence threshold, no per-request γ schedule); this command drafts a fixed γ."
    ]

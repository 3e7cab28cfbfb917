"""Which object runs a model's forwards: the job's choice of `forward.path`, one place for all decoders.

`eager`: a fresh `CachedLM` per decode (the reference). `static` / `compiled`: one `StaticLM` per
(model, capacity) for the whole process, so its buffers, and for `compiled` its compiled graphs, are
made once and every decode, the C_t(k) micro-benchmark included, reuses them.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedModel

from specbench.decoding.forward_choice import ForwardChoice
from specbench.decoding.kvcache import CachedLM
from specbench.decoding.lm import LM
from specbench.decoding.static_kv import StaticLM

DRAFT_KS = (1, 2)  # a draft's forwards: one step, or a round's catch-up of two tokens after all drafts passed
DECODE_KV_DRAFT_KS = (1,)  # a draft on the target's decode K/V (`ModelDraft.target_decode_kv`) never catches up
RUNNABLE = ("eager", "static", "compiled")  # the paths an LM object is made for (auto resolves to one)
CAPACITY_STEP = 64  # capacities round up to this, so jobs whose needs differ a little share graphs
_STATIC: dict[tuple, StaticLM] = {}  # (id(model), capacity, compile mode) -> the process's StaticLM


def target_ks(*gammas: int) -> list[int]:
    """k of the target's forwards at these γ: the plain step (1) and each verify (γ + 1)."""
    return sorted({1, *(g + 1 for g in gammas if g >= 1)})


def capacity_for(prompt_lens: list[int], max_new_tokens: int, gamma: int) -> int:
    """KV columns a row can need: its prompt, every new token and one verify forward of γ + 1 on top."""
    need = max(prompt_lens) + max_new_tokens + gamma + 2
    return -(-need // CAPACITY_STEP) * CAPACITY_STEP


def check_context(prompt_lens: dict[str, int], max_new_tokens: int, model: PreTrainedModel) -> None:
    """Refuse prompts (id -> length) that with `max_new_tokens` need more positions than the model's
    context (`config.max_position_embeddings`): past it a model's outputs are not what it was trained for."""
    context = getattr(model.config, "max_position_embeddings", None)
    if not context:
        return
    over = {name: n for name, n in prompt_lens.items() if n + max_new_tokens > context}
    if over:
        name, n = next(iter(over.items()))
        more = f" (and {len(over) - 1} more prompts)" if len(over) > 1 else ""
        raise ValueError(
            f"prompt {name} has {n} tokens{more}: with max_new_tokens={max_new_tokens} it needs {n + max_new_tokens} "
            f"positions, more than the target's context of {context} (max_position_embeddings); shorten the prompt "
            f"to at most {max(context - max_new_tokens, 0)} tokens or lower max_new_tokens"
        )


class ForwardPath:
    """Hands out the LM object for a model on this path (`path`: a name in `config.FORWARD_PATHS`)."""

    def __init__(
        self, path: str = "eager", compile_mode: str = "max-autotune", capacity: int | None = None, reason: str = ""
    ) -> None:
        if path not in RUNNABLE:
            raise ValueError(
                f"ForwardPath(path={path!r}): must be one of {list(RUNNABLE)} (resolve auto first: forward_choice)"
            )
        self.path, self.compile_mode, self.capacity = path, compile_mode, capacity
        self.reason = reason  # why forward.path=auto chose this path ("" when it was asked for by name)

    @classmethod
    def chosen(cls, choice: ForwardChoice, capacity: int | None) -> ForwardPath:
        """The path `forward_choice.choose` picked, with its reason."""
        return cls(choice.path, choice.compile_mode, capacity, choice.reason)

    @property
    def fast(self) -> bool:
        return self.path != "eager"

    @property
    def mode(self) -> str | None:
        """The compile mode of this path's StaticLMs (None: not compiled)."""
        return self.compile_mode if self.path == "compiled" else None

    def lm(self, model: PreTrainedModel) -> LM:
        """The LM to decode with: fresh for eager, the process's one StaticLM otherwise (prefill resets it)."""
        if not self.fast:
            return CachedLM(model)
        if self.capacity is None:
            raise ValueError(f"forward.path={self.path!r} needs forward.capacity (the job sizes it: capacity_for)")
        key = self._key(model)
        if key not in _STATIC or _STATIC[key].source is not model:
            _STATIC[key] = StaticLM(model, self.capacity, compile_mode=self.mode)
        return _STATIC[key]

    def _key(self, model: PreTrainedModel) -> tuple:
        return (id(model), self.capacity, self.mode)

    def warm_up(self, model: PreTrainedModel | None, batch_size: int, ks: list[int]) -> float:
        """Compile every (batch_size, k) forward of `model` before anything is timed; seconds (0 for eager)."""
        if model is None or not self.fast:
            return 0.0
        return self.lm(model).warm_up(batch_size, ks)

    def warm_up_pair(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | None,
        batch_size: int,
        gamma: int,
        draft_ks: Sequence[int] = DRAFT_KS,
    ):
        """Every shape a job's decoders run at this γ (target: `target_ks`; draft: `draft_ks`, only when
        it drafts); seconds per model, {} for eager."""
        if not self.fast:
            return {}
        seconds = {"target": self.warm_up(target, batch_size, target_ks(gamma))}
        if draft is not None and gamma >= 1:
            seconds["draft"] = self.warm_up(draft, batch_size, list(draft_ks))
        return seconds

    def new_shapes(self, *models: PreTrainedModel | None) -> int:
        """Forwards since warm-up that met a shape warm-up had not (compiled inside a decode): should be 0.
        Reads the StaticLMs that exist; a model this path never ran gets none made for it."""
        if not self.fast:
            return 0
        found = [(m, _STATIC.get(self._key(m))) for m in models if m is not None]
        return sum(lm.new_shapes for m, lm in found if lm is not None and lm.source is m)

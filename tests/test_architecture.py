"""The package's shape: no import cycles, no module too long to read, kinds added by one registration."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pandas as pd
import pytest
from conftest import EAGER
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from specbench.app import CONF_DIR, to_config
from specbench.bench.runstore import load_sweep
from specbench.models.draft_kinds import DRAFT_KINDS, DraftKind

PKG = Path(__file__).resolve().parents[1] / "specbench"
MAX_LINES = 400  # the guide's "no module past ~400 lines"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Lines inside `if TYPE_CHECKING:` blocks: annotations only, never imported at run time."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def import_graph() -> dict[str, set[str]]:
    """specbench module -> the specbench modules it imports, function-local imports included."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_lines(tree)
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                ]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def test_no_import_cycles():
    graph = import_graph()
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_import_graph_sees_function_local_imports(tmp_path):
    # The cycle check must not be blind to the imports that used to paper over cycles.
    graph = import_graph()
    assert "specbench.api" in graph["specbench"]  # imported inside specbench.__getattr__


def test_no_module_too_long_to_read():
    long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def _private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


def test_no_private_imports_across_modules():
    modules = _modules()
    bad = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        aliases = set()  # local names bound to other specbench modules (`from specbench import runstore as rs`)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specbench"):
                bad += [f"{name}: from {node.module} import {a.name}" for a in node.names if _private(a.name)]
                aliases |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in modules}
            elif isinstance(node, ast.Import):
                aliases |= {a.asname for a in node.names if a.asname and a.name in modules}
        bad += [
            f"{name}: {n.value.id}.{n.attr}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id in aliases
            and _private(n.attr)
        ]
    assert not bad, bad


@pytest.fixture
def toy_draft_kind():
    """A new draft kind, registered once: bigram lookup (n-gram lookup limited to n = 1)."""

    def build(pair):
        from specbench.decoding.drafts import NgramDraft

        return NgramDraft(pair.target.config.vocab_size, 1, 1, device=pair.target.device)

    DRAFT_KINDS.register(
        "toy_bigram",
        DraftKind(load=lambda *a: (None, None), label=lambda t, p, d: "bigram", build=build, has_model=False),
    )
    yield "toy_bigram"
    DRAFT_KINDS.unregister("toy_bigram")


def test_a_new_draft_kind_needs_one_registration(toy_draft_kind, tmp_path):
    from specbench.bench.job import run_job

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        overrides = [
            "pair=tiny",
            "workload=synthetic",
            "workload.n_prompts=2",
            "workload.prompt_tokens=8",
            f"draft.kind={toy_draft_kind}",
            "max_new_tokens=6",
            "gamma=2",
            "ct_bench=false",
            "report=false",
        ]
        cfg = to_config(compose("config", overrides=[EAGER, *overrides]))
    assert cfg.draft.kind == toy_draft_kind
    assert run_job(cfg, tmp_path / "job")
    rounds = load_sweep(tmp_path, "rounds")
    spec = rounds[rounds["decoder"] == "speculative"]
    assert set(spec["draft_kind"]) == {toy_draft_kind} and set(spec["draft"]) == {"bigram"}
    assert isinstance(rounds, pd.DataFrame) and len(spec) > 0


def test_unknown_draft_kind_names_the_choices():
    with pytest.raises(
        ValueError, match=r"draft.kind='nope': must be one of \['model', 'w8a16', 'w4a16', 'w4a16h8', 'ngram'"
    ):
        DRAFT_KINDS.get("nope", "draft.kind")

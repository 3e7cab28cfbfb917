"""The README and docs/ stay true: links resolve, generated pages are current, evidence folders are cited,
no package-index address is written into the project, and the README's commands and example run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specbench.config.reference import render as render_configuration
from specbench.report.evidence import check_citations, render_index

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TEST_COMMAND = 'python -m pytest -q -m "not slow" -n 2 --dist loadfile'
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def broken_links(pages: list[Path], root: Path = ROOT) -> list[str]:
    """Each relative markdown link (file or folder, anchors ignored) that does not resolve."""
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(root).as_posix()}: {target}")
    return broken


def _pages() -> list[Path]:
    others = [ROOT / "analysis" / "README.md", ROOT / "analysis" / "INDEX.md", ROOT / "scripts" / "README.md"]
    return [README, *sorted((ROOT / "docs").glob("*.md")), *others]


def test_readme_is_short():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def test_every_relative_link_resolves():
    assert broken_links(_pages()) == []


def test_a_broken_link_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("[ok](page.md) [gone](missing.md#x) [web](https://example.com)\n")
    assert broken_links([tmp_path / "docs" / "page.md"], tmp_path) == ["docs/page.md: missing.md#x"]


def test_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "README.md":
            assert f"]({page.name})" in index, page.name


def test_configuration_reference_is_generated():
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == render_configuration(), "run: python -m specbench.config.reference > docs/configuration.md"


def test_evidence_index_is_generated():
    committed = (ROOT / "analysis" / "INDEX.md").read_text(encoding="utf-8")
    assert committed == render_index(), "run: python -m specbench.report.evidence > analysis/INDEX.md"


def test_every_evidence_folder_exists_and_is_cited():
    assert check_citations() == []


def test_a_dangling_or_uncited_folder_is_reported(tmp_path):
    (tmp_path / "analysis" / "kept").mkdir(parents=True)
    (tmp_path / "analysis" / "orphan").mkdir()
    (tmp_path / "README.md").write_text("see analysis/kept/ and analysis/gone/; specbench/analysis/rows.py\n")
    assert check_citations(tmp_path) == [
        "cited but missing: analysis/gone/ (in README.md)",
        "not cited anywhere: analysis/orphan/",
    ]


def test_every_evidence_folder_has_a_manifest():
    for folder in sorted(p for p in (ROOT / "analysis").iterdir() if p.is_dir()):
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        assert {"claim", "commit", "command", "hardware", "environment", "report"} <= set(manifest), folder.name
        assert (folder / "MANIFEST.md").is_file() and (folder / manifest["report"]).is_file(), folder.name
        for repeat in manifest["repeats"]:
            assert (folder / repeat["folder"]).is_dir(), (folder.name, repeat)


def test_no_package_index_address_in_the_repository():
    # The user's own pip configuration (index, mirror, proxy) must apply: no address is written here.
    # The patterns are assembled so that this file does not match itself.
    patterns = [
        re.escape("pypi" + ".org"),
        re.escape("files." + "pythonhosted.org"),
        r"https?://[^\s\"')]*/" + "simple\\b",
    ]
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in files:
        path = ROOT / name
        if not path.is_file() or path.suffix in {".png", ".parquet"}:
            continue
        text = path.read_text(encoding="utf-8", errors="ignore")
        hits += [f"{name}: {m.group(0)}" for p in patterns for m in re.finditer(p, text)]
    assert hits == []


def test_configs_point_at_modules_that_exist():
    for yaml in sorted((ROOT / "conf").rglob("*.yaml")):
        for ref in re.findall(r"specbench/[\w/]+\.py", yaml.read_text(encoding="utf-8")):
            assert (ROOT / ref).is_file(), f"{yaml.relative_to(ROOT)}: {ref}"


def test_readme_test_command_is_what_ci_runs():
    readme = README.read_text(encoding="utf-8")
    ci_last = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()][-1]
    assert ci_last == TEST_COMMAND
    assert readme.count(TEST_COMMAND) == 1


def _readme_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_sweep_command_runs_on_the_tiny_pair(tmp_path):
    install = next(b for b in _readme_blocks("bash") if "+sweep=gamma" in b and "pip install -e ." in b)
    command = install.strip().split("&&")[-1].split()
    assert command[:3] == ["python", "-m", "specbench"], command
    tiny = ["pair=tiny", "draft=model", "workload=synthetic", "workload.n_prompts=1", "workload.prompt_tokens=8"]
    tiny += ["max_new_tokens=4", "ct_bench=false", "report=false", "gamma=1,2"]
    # the fast path uncompiled: a compiled job is test_fast_path.py's (~45 s of compile here)
    tiny += ["forward=static"]
    tiny += [f"runs_dir={tmp_path / 'runs'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one torch thread, as every test: the other core is another's
    run = subprocess.run(
        [sys.executable, *command[1:], *tiny], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(list((tmp_path / "runs" / "gamma").glob("*/done.json"))) == 2


@pytest.fixture
def tiny_target_dir(tmp_path):
    """A tiny random Llama with the embedded model's tokenizer, saved as a model directory."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from specbench.models.loading import embedded_gguf

    try:
        gguf = embedded_gguf()
    except Exception as exc:  # noqa: BLE001 - the wheel is optional outside CI
        pytest.skip(str(exc))
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    import torch

    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def test_readme_python_example_runs_on_a_tiny_target(tiny_target_dir, capsys):
    (example,) = _readme_blocks("python")
    assert 'target="embedded"' in example
    code = example.replace('target="embedded"', f"target={str(tiny_target_dir)!r}").replace(
        "max_new_tokens=32", "max_new_tokens=8"
    )
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "accepted" in printed and "new_tokens" in printed


def _readme_sweep_commands() -> list[list[str]]:
    """The overrides of every `python -m specbench ...` line in the README's shell blocks."""
    commands = []
    for block in _readme_blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("&&")[-1].split("#")[0].strip()
            if line.startswith("python -m specbench "):
                commands.append(line.split()[3:])
    return commands


@pytest.mark.parametrize("overrides", _readme_sweep_commands(), ids=" ".join)
def test_readme_sweep_commands_compose_and_validate(overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from specbench.app import CONF_DIR, to_config

    # a sweep value (gamma=2,4,6) composes as its first value; hydra.* settings are the launcher's
    plain = [o if "," not in o or "[" in o else o.split(",")[0] for o in overrides if not o.startswith("hydra.")]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=plain)
    to_config(cfg)


def test_manifest_is_written_from_a_runs_records(tmp_path):
    from specbench.report.evidence import main

    run = tmp_path / "runs" / "gamma"
    (run / "gamma=1").mkdir(parents=True)
    env = {
        "git": {"commit": "0123456789abcdef0123", "dirty": False},
        "time": "2026-12-04T10:00:00+00:00",
        "hardware_label": "cpu:Intel Xeon avx512+bf16+amx x2",
        "cpu": {"isa": {"flags": ["avx2", "amx_bf16"], "torch_capability": "AVX512"}, "torch_threads": 2},
        "libraries": {"torch": "2.13.0+cpu", "transformers": "5.24.0"},
        "python": "3.11.7",
        "platform": "Linux",
    }
    (run / "gamma=1" / "env.json").write_text(json.dumps(env))
    (run / "multirun.yaml").write_text("hydra:\n  overrides:\n    task: [+sweep=gamma, threads=2]\n")
    folder = tmp_path / "analysis" / "gamma_sweep_x"
    (folder / "repeats" / "run2").mkdir(parents=True)
    (folder / "report.md").write_text("# report\n")
    main(["manifest", str(folder), "--run", str(run), "--claim", "A claim."])
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["commit"] == "0123456789ab" and manifest["command"] == "python -m specbench +sweep=gamma threads=2"
    assert manifest["hardware"]["device"] == "cpu:Intel Xeon avx512+bf16+amx x2"
    assert "torch 2.13.0+cpu" in manifest["environment"] and manifest["report"] == "report.md"
    assert manifest["repeats"] == [{"folder": "repeats/run2"}]
    main(["manifest", str(folder)])  # updating keeps what it is not given
    assert json.loads((folder / "manifest.json").read_text())["claim"] == "A claim."
    with pytest.raises(SystemExit, match="no claim"):
        main(["manifest", str(tmp_path / "analysis"), "--run", str(run)])

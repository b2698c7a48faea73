"""Every config the project ships (configs/*.yaml) and every YAML block of README.md and docs/*.md loads with its
command's loader without a notice: no old spelling, no warning. Old spellings stay accepted for users' own
configs (tests/core/test_config_tree.py, tests/trainer/test_report_to.py), with their notice."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import pytest
import yaml

from grpo_fast.pipeline.runner import load_pipeline_config
from grpo_fast.sft.config import load_sft_config
from grpo_fast.trainer.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
YAML_BLOCK = re.compile(r"```ya?ml\n(.*?)```", re.S)
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
DOCS_PACKAGE = "my_pkg"
"""The user package docs/architecture.md's extension examples name in `imports` (my_pkg.losses)."""


def _load(data: dict) -> None:
    """Loads `data` as the command that reads it would: a pipeline (stages), an SFT config (the sft command's
    sections) or a training config."""
    if "stages" in data:
        load_pipeline_config(data)
    elif _is_sft(data):
        load_sft_config(data)
    else:
        load_config(data)


def _is_sft(data: dict) -> bool:
    """SFT configs have keys only the SFT tree knows (data.max_length / packing / completion_column, run.epochs)."""
    data_keys, run_keys = set(data.get("data") or {}), set(data.get("run") or {})
    return bool(data_keys & {"max_length", "packing", "completion_column"} or run_keys & {"epochs", "grad_accum"})


def _doc_blocks() -> list[tuple[str, str]]:
    return [(f"{p.name}#{i}", block) for p in DOCS for i, block in enumerate(YAML_BLOCK.findall(p.read_text()))]


def test_there_are_configs_and_doc_blocks_to_check():
    assert len(CONFIGS) >= 5 and len(_doc_blocks()) >= 4


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_a_shipped_config_loads_without_a_notice(path, caplog):
    caplog.set_level(logging.WARNING)
    _load(yaml.safe_load(path.read_text()))
    notices = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert notices == [], f"{path.name}: {notices}"


@pytest.fixture
def docs_package(tmp_path, monkeypatch):
    """my_pkg.losses made of architecture.md's own Python examples that register a loss type or an objective, as
    the user the docs address would have written it; its registrations undone afterwards."""
    from grpo_fast.loss import LOSS_TYPES, OBJECTIVES

    examples = [b for b in PYTHON_BLOCK.findall((ROOT / "docs" / "architecture.md").read_text()) if ".register(" in b]
    examples = [b for b in examples if "LOSS_TYPES.register" in b or "OBJECTIVES.register" in b]
    package = tmp_path / DOCS_PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "losses.py").write_text("\n\n".join(examples))
    monkeypatch.syspath_prepend(str(tmp_path))
    before = {registry: set(registry.names()) for registry in (LOSS_TYPES, OBJECTIVES)}
    yield
    for module in [m for m in sys.modules if m.split(".")[0] == DOCS_PACKAGE]:
        del sys.modules[module]
    for registry, names in before.items():
        for name in set(registry.names()) - names:
            registry.unregister(name)


@pytest.mark.parametrize(("where", "block"), _doc_blocks(), ids=[w for w, _ in _doc_blocks()])
def test_a_yaml_block_of_the_docs_loads_without_a_notice(where, block, caplog, request):
    if any(str(m).split(".")[0] == DOCS_PACKAGE for m in yaml.safe_load(block).get("imports") or []):
        request.getfixturevalue("docs_package")
    caplog.set_level(logging.WARNING)
    _load(yaml.safe_load(block))
    notices = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert notices == [], f"{where}: {notices}"


def test_old_spellings_still_load_with_their_notice(caplog):
    caplog.set_level(logging.WARNING)
    old = {"rollout": {"dtype": "float32", "kv_cache_memory_bytes": 1 << 26}, "data": {"use_chat_template": "false"}}
    cfg = load_config(old)
    assert cfg.rollout.vllm.dtype == "float32" and cfg.data.use_chat_template is False
    text = caplog.text
    assert "rollout.dtype is the old spelling of rollout.vllm.dtype" in text and "use_chat_template" in text

"""benchmarks/tables.py: every marked table in README.md, docs/ and benchmarks/ is what its results JSON renders to
(a number typed or left over by hand fails), a marker naming a missing results file is named, and every results
file of a known benchmark renders."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("tables", ROOT / "benchmarks" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_marked_table_matches_its_json(tables):
    paths = [p for p in tables.default_markdown_files() if p.exists()]
    assert ROOT / "docs" / "benchmarks.md" in paths
    assert tables.check(paths) == []
    assert "<!-- table: bench_loss_cpu -->" in (ROOT / "docs" / "benchmarks.md").read_text()


def test_a_hand_edited_number_fails(tables, tmp_path):
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    start = text.index("<!-- table: bench_loss_cpu -->")
    row = text.index("| cpu-32k", start)  # the first data row of the loss table
    cell = text.index(" | ", text.index(" | fp32 | ", row) + 9) + 3  # the median of the first row
    edited = text[:cell] + "9" + text[cell:]
    doc = tmp_path / "doc.md"
    doc.write_text(edited)
    (problem,) = tables.check([doc])
    assert "table bench_loss_cpu differs" in problem
    assert tables.rendered(edited) == text  # rendering puts the JSON's number back


def test_a_missing_results_file_is_named(tables, tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- table: no_such_results -->\n| x |\n<!-- /table -->\n")
    (problem,) = tables.check([doc])
    assert "no_such_results.json: no such results file" in problem


def test_every_known_results_file_renders(tables):
    for path in sorted(tables.RESULTS.glob("*.json")):
        if json.loads(path.read_text()).get("benchmark") in tables.RENDERERS:
            assert tables.render(path).startswith("| "), path

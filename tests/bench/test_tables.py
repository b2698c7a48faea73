"""benchmarks/tables.py: every marked table in README.md, docs/ and benchmarks/ is what its results JSON renders to
(a number typed or left over by hand fails), a marker naming a missing results file is named, every results
file of a known benchmark renders, and each results file behind the tables is reported with the commits it was
measured at and how far behind HEAD each is."""

from __future__ import annotations

import importlib.util
import json
import subprocess
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


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_each_source_is_reported_with_its_commit_and_how_far_behind_head_it_is(tables, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    commits = []
    for i in range(3):
        (repo / "f").write_text(str(i))
        _git(repo, "add", "f")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", str(i))
        commits.append(_git(repo, "rev-parse", "HEAD"))
    assert tables.commits_behind(commits[0], repo) == f"{commits[0][:12]}: 2 commits behind HEAD"
    assert tables.commits_behind(commits[1][:7] + "+dirty", repo).endswith(
        "(uncommitted changes on top): 1 commit behind HEAD"
    )
    assert tables.commits_behind(commits[2], repo).endswith(": HEAD")
    assert "not in this repository's history" in tables.commits_behind("0" * 40, repo)

    results = tmp_path / "results"
    results.mkdir()
    stamp = {"commit": commits[0], "cpu": "x", "cpu_count": 2}
    (results / "one.json").write_text(json.dumps({"environment": stamp, "runs": [{"environment": {"commit": "f00"}}]}))
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- table: one -->\n<!-- /table -->\n<!-- table: two -->\n<!-- /table -->\n")
    one, two = tables.source_report([doc], results)
    assert one.startswith(f"one.json: {commits[0][:12]}: ") and "; f00: not in this repository's history" in one
    assert two == "two.json: no such results file"
    headline = tables.source_report([ROOT / "README.md"])
    assert [line.split(":")[0] for line in headline][: len(tables.HEADLINE_SOURCES)] == list(tables.HEADLINE_SOURCES)

"""benchmarks/tables.py: every marked table in README.md, docs/ and benchmarks/ is what its results JSON renders to
(a number typed or left over by hand fails), a marker naming a missing results file is named, every results
file of a known benchmark renders, and each results file behind the tables is reported with the commits it was
measured at and how far behind HEAD each is."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tables(load_script):
    return load_script("benchmarks/tables.py", "tables")


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


def _loss_row(variant, n, median=None, extra=None, status=None, model="m"):
    row = {"variant": variant, "model": model, "N": n, "H": 8, "V": 32, "dtype": "bf16", "flops_per_step": 1}
    if status is not None:
        return row | {"status": status}
    row |= {"median_s": median, "p20_s": median, "p80_s": median}
    return row | ({} if extra is None else {"peak_extra_bytes": extra})


def _loss_payload(rows):
    stamp = {"gpu": "GPU-X", "commit": "abc", "date": "d", "torch": "2.11"}
    return {"benchmark": "loss", "config": {"loss_type": "dapo"}, "runs": [{"command": "c", "environment": stamp}],
            "results": rows}  # fmt: skip


def test_an_error_row_stays_one_table_row(tables):
    """A variant's error text may end in a newline or hold '|' (Liger's did): its row must stay one table row."""
    rows = [_loss_row("gemm3", 16384, 0.1), _loss_row("liger", 16384, status="error: IndexError: a | b\n")]
    text = tables.render_loss(_loss_payload(rows)).split("\n\n")[0]
    widths = {line.count("|") for line in text.splitlines()}
    assert len(widths) == 1 and all(line.startswith("| ") for line in text.splitlines()[2:]), text


def test_gpu_goals_and_headline_are_the_runs_ratios(tables, tmp_path):
    rows = [
        _loss_row("gemm3", 16384, 0.100),
        _loss_row("cuda", 16384, 0.120, extra=40),  # 1.20x the GEMMs (goal <= 1.25: met)
        _loss_row("triton", 16384, 0.200, extra=40),  # 2.00x (goal <= 1.5: missed)
        _loss_row("naive", 16384, 0.130, extra=1000),  # memory 4.0% of naive's: met
        _loss_row("trl", 16384, 0.096, extra=50),  # cuda 0.80x as fast: missed
        _loss_row("liger", 16384, status="error: InternalTorchDynamoError: IndexError: list index out of range\n"),
        _loss_row("cuda", 4096, 0.001, extra=1),  # another N: not a goal's row
    ]
    (tmp_path / tables.GPU_LOSS).write_text(json.dumps(_loss_payload(rows)))
    goals = {line.split(" | ")[0][2:]: line for line in tables.render_gpu_goals(tmp_path).splitlines()}
    assert "| 1.20x | 1 of 1 measured |" in goals["`cuda` fwd+bwd ≤ 1.25x three cuBLAS GEMMs"]
    assert "| 2.00x (missed) | 0 of 1 measured |" in goals["`triton` fwd+bwd ≤ 1.5x three cuBLAS GEMMs"]
    assert "| 0.80x (missed) |" in goals["`cuda` ≥ 1.25x faster than TRL 1.16's head with its loss"]
    assert "| 4.0% | 1 of 1 measured |" in goals["`cuda` extra memory ≤ 1/20 of naive's"]
    liger = goals["`cuda` ≥ 1.5x faster than Liger-Kernel's chunked loss"]
    assert "not measured (Liger-Kernel: error: InternalTorchDynamoError) | 0 of 0 measured" in liger
    headline = tables.render_headline_gpu(tmp_path)
    assert "| `cuda`: 120 ms, 0.0 MiB extra | three cuBLAS GEMMs (speed of light): 100 ms | 1.20x time |" in headline
    assert "naive full logits: 130 ms, 0.0 MiB | 0.92x time, 0.040x memory |" in headline


def test_gpu_profile_rows_and_provenance(tables):
    """gpu_profile.py's JSON: per variant the kernels' time by kind and its share of the timed median; a run whose
    tree was another commit than its stamp's says both."""

    def variant(median, busy, kinds, kernels):
        top = [{"name": "k" * 60, "kind": "GEMM", "count": 3, "total_ms": 1.5}]
        return {"median_s": median, "profile": {"busy_ms": busy, "by_kind_ms": kinds, "kernel_count": kernels,
                                                "kernels": top}}  # fmt: skip

    payload = {
        "benchmark": "gpu_profile", "shape": {"model": "m", "N": 4, "H": 8, "V": 32}, "dtype": "bf16",
        "bandwidth": {"copy_gb_per_s": 4000.4, "read_gb_per_s": 4100.0}, "commands": ["python3 p.py"],
        "environment": {"gpu": "GPU-X", "commit": "abc1234+dirty", "tree_commit": "def5678", "date": "d"},
        "variants": {
            "gemm3": variant(0.100, 90.0, {"GEMM": 90.0}, 3),
            "cuda": variant(0.150, 147.0, {"GEMM": 120.0, "grpo_fast CUDA epilogue": 20.0, "other": 7.0}, 99),
        },
    }  # fmt: skip
    rows = {line.split(" | ")[0][2:]: line for line in tables.render_gpu_profile(payload).splitlines()}
    assert rows["cuda"].startswith(
        "| cuda | 150 | 1.50 | 99 | 147.0 | 120.0 | 20.0 | 7.0 | 0.98 | `" + "k" * 52 + "` x3"
    )
    assert rows["gemm3"].startswith("| gemm3 | 100 | 1.00 | 3 | 90.0 | 90.0 |  | 0.0 | 0.90 |")
    note = tables.render_gpu_profile(payload).split("\n\n")[1]
    assert "copy 4000 GB/s, read 4100 GB/s" in note and "commit def5678 (stamped abc1234+dirty)" in note


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
    # A device's copy stamped its stale HEAD beside the tree it ran (tree_commit): the tree's commit is reported.
    (results / "three.json").write_text(
        json.dumps({"stamp": {"commit": "0" * 40, "tree_commit": commits[2]}, "results": {}})
    )
    doc.write_text("".join(f"<!-- table: {name} -->\n<!-- /table -->\n" for name in ("one", "two", "three")))
    one, two, three = tables.source_report([doc], results)
    assert three.startswith(f"three.json: {commits[2][:12]}: ")  # bench_sandbox_bounds.py's "stamp"
    assert one.startswith(f"one.json: {commits[0][:12]}: ") and "; f00: not in this repository's history" in one
    assert two == "two.json: no such results file"
    headline = tables.source_report([ROOT / "README.md"])
    reported = [line.split(":")[0] for line in headline]
    assert all(name in reported for name in (*tables.HEADLINE_SOURCES, tables.GPU_LOSS)), reported
    assert not any(line.endswith("no such results file") for line in headline), headline


def test_a_stamp_is_dirty_for_changed_code_and_not_for_the_benchmarks_own_results(tmp_path):
    """A queue of benchmarks writes benchmarks/results/ as it goes: the next one's stamp still names a clean commit,
    while any other tracked change (the code measured) makes it +dirty."""
    from grpo_fast.machine import changed_files, git_commit

    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "code.py").write_text("x = 1\n")
    (repo / "benchmarks" / "results" / "a.json").write_text("{}")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "0")
    head = _git(repo, "rev-parse", "--short", "HEAD")

    (repo / "benchmarks" / "results" / "a.json").write_text('{"step_s": 1.0}')
    (repo / "untracked.txt").write_text("not part of the tree")
    assert (changed_files(repo), git_commit(repo)) == ([], head)
    (repo / "code.py").write_text("x = 2\n")
    assert (changed_files(repo), git_commit(repo)) == (["code.py"], head + "+dirty")


def _tools_run(contender, seed, steps, accuracy_after):
    return {"contender": contender, "seed": seed, "steps": len(steps), "step_seconds": steps,
            "step_seconds_mean": sum(steps) / len(steps), "accuracy_before": 0.2, "tool_call_rate_before": 0.5,
            "accuracy_after": accuracy_after, "tool_call_rate_after": 1.0}  # fmt: skip


def test_tools_trl_rows_are_medians_over_every_step_of_every_seed(tables):
    """The step time is the median over all of a contender's steps (one 100 s step of one seed moves its mean,
    not its median); "vs TRL" is the ratio of the two medians; accuracy is the mean over seeds with its range."""
    runs = [
        _tools_run("grpo_fast", 0, [0.3, 0.4, 0.5], 0.8),
        _tools_run("grpo_fast", 1, [0.2, 0.3, 0.3], 0.6),  # all steps: 0.2 0.3 0.3 0.3 0.4 0.5 -> median 0.3
        _tools_run("trl", 0, [0.5, 0.6, 100.0], 0.7),
        _tools_run("trl", 1, [0.4], 0.9),  # all steps: 0.4 0.5 0.6 100 -> median 0.55
    ]
    settings = {"budget_seconds": 150.0, "prompts_per_step": 16, "num_generations": 8, "max_completion_length": 64,
                "max_tool_calling_iterations": 2, "eval_prompts": 200}  # fmt: skip
    stamp = {"cpu": "CPU-X", "commit": "abc", "date": "d", "torch": "2.13"}
    payload = {"benchmark": "tools_trl", "command": "c", "environment": stamp, "settings": settings, "runs": runs}
    rows = [line.split(" | ") for line in tables.render_tools_trl(payload).split("\n\n")[0].splitlines()[2:]]
    assert [row[0].strip("| ") for row in rows] == ["grpo_fast", "trl"]
    assert rows[0][1:5] == ["2", "3", "0.30", f"{0.3 / 0.55:.2f}x"]  # seeds, steps (mean), median, vs TRL
    assert rows[1][1:6] == ["2", "2", "0.55", "1.00x", f"{(101.1 / 3 + 0.4) / 2:.2f}"]  # the mean keeps the 100 s
    assert rows[0][6] == "0.20 -> 0.70 [0.60, 0.80]" and rows[1][6] == "0.20 -> 0.80 [0.70, 0.90]"


def test_a_stamp_keeps_the_command_line_its_table_names(monkeypatch, tables):
    """The SFT, logits-tile and R1 tables named their script's plain command whatever options the run was given."""
    from grpo_fast.bench.common import environment_stamp

    monkeypatch.setattr("sys.argv", [str(ROOT / "benchmarks" / "bench_sft.py"), "--seq-len", "64", "--note", "a b"])
    stamp = environment_stamp()
    assert stamp["command"] == "python benchmarks/bench_sft.py --seq-len 64 --note 'a b'"
    row = {"contender": "grpo_fast", "median_s": 1.0, "p20_s": 1.0, "p80_s": 1.0, "time_vs_transformers": 0.5}
    row |= {"peak_extra_bytes": 1 << 20, "memory_vs_transformers": 0.5}
    rendered = tables.render_sft({"environment": stamp, "results": [row]})
    assert "From `python benchmarks/bench_sft.py --seq-len 64 --note 'a b'` on" in rendered


def test_rows_that_failed_render_as_their_status(tables):
    """gpu_profile.py writes a part that failed as {variant, status}: the table crashed on it (KeyError 'profile');
    the TRL-integration table put a multi-line error into one cell, breaking the Markdown table."""
    stamp = {"commit": "abc", "cpu": "x", "cpu_count": 2, "date": "2026-12-05", "load_average_1_5_15": [1, 1, 1]}
    profile = {
        "variants": {"triton": {"variant": "triton", "status": "error: RuntimeError: no GPU |\n  here"}},
        "shape": {"model": "tiny", "N": 64, "H": 32, "V": 256}, "dtype": "fp32", "environment": stamp, "commands": [],
    }  # fmt: skip
    rendered = tables.render_gpu_profile(profile)
    assert "| triton | error: RuntimeError: no GPU / here |" in rendered
    trl = {"runs": [{"variant": "ours_loss", "status": "error: shapes\nTraceback (most recent call last)"}]}
    rendered = tables.render_trl_integration(trl | {"command": "python x.py", "environment": stamp})
    assert "| ours_loss | error: shapes Traceback (most recent call last) |" in rendered


def test_a_sandbox_setup_this_machine_cannot_run_is_named_not_left_out_silently(tables):
    """bench_sandbox_bounds.py without bwrap measures the namespaces backend only; the table said nothing of the
    three bwrap setups it lacked."""
    payload = json.loads((ROOT / "benchmarks" / "results" / "sandbox_bounds.json").read_text())
    why = "no bwrap binary (Debian/Ubuntu: apt-get install bubblewrap)"
    lacking = [name for name in payload["results"] if name.startswith("bwrap")]
    payload["skipped"] = dict.fromkeys(lacking, why)
    payload["results"] = {name: v for name, v in payload["results"].items() if name not in lacking}
    text = tables.render_sandbox_bounds(payload)
    assert text.splitlines()[0] == "| attack | namespaces (root) |"
    for name in lacking:
        assert f"Not measured: {name}, {why}." in text

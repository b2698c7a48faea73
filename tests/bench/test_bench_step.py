"""benchmarks/bench_step.py --quick runs end to end on the tiny config: the JSON has its structure, positive step
and phase times, every row names its attention, and grpo_fast (its defaults) and TRL generated (and trained on)
the same number of completions per step, as counted by the reward function in each contender's own process."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_fast.bench.common import REPO_ROOT
from grpo_fast.bench.step.configs import PHASES, step_config

HAS_TRL = importlib.util.find_spec("trl") is not None

# Each contender runs in its own interpreter (imports of trl and vLLM included): 1-2 minutes on 2 cores.
pytestmark = pytest.mark.slow


def _quick(contenders: list[str], out: Path, work: Path) -> None:
    """`bench_step.py --quick` of the tiny config for `contenders`, into `out`, under `work`; it must succeed."""
    cmd = [sys.executable, "benchmarks/bench_step.py", "--quick", "--configs", "tiny", "--contenders", *contenders]
    cmd += ["--out", str(out), "--work", str(work)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench_step")
    out = tmp / "bench_step.json"
    _quick(["grpo_fast", *(["trl"] if HAS_TRL else [])], out, tmp / "work")
    return json.loads(out.read_text()), out


def _contender(data: dict, name: str) -> dict:
    return next(r for r in data["configs"]["tiny"]["contenders"] if r["contender"] == name)


def _check_contender(run: dict, steps: int) -> None:
    assert len(run["records"]) == steps and len(run["warmup_records"]) == 1
    assert run["peak_rss_bytes"] > 0 and run["settings"]
    for rec in run["records"]:
        assert rec["step_s"] > 0
        assert set(PHASES) <= set(rec["phases_s"])
        assert rec["phases_s"]["generate"] > 0 and rec["phases_s"]["train"] > 0
        assert rec["completions"] == rec["sequences_trained"] == step_config("tiny", quick=True).completions_per_step
        assert (
            0 < rec["completion_tokens"] <= rec["completions"] * step_config("tiny", quick=True).max_completion_length
        )
    summary = run["summary"]
    assert summary["step_median_s"] > 0 and summary["completion_tokens_per_s"] > 0


def test_quick_grpo_fast(quick_run):
    data, out = quick_run
    env = data["environment"]
    assert env["commit"] and isinstance(env["dirty_files"], list) and env["cpu_count"] >= 1
    assert env["versions"]["torch"] and env["versions"]["transformers"]
    assert data["settings"]["quick"] and data["settings"]["steps"] == 2
    assert data["configs"]["tiny"]["policy"]["parameters"] > 0
    run = _contender(data, "grpo_fast")
    _check_contender(run, data["settings"]["steps"])
    assert run["engine"] == "hf"  # rollout.engine auto at 0.3M parameters on CPU
    assert out.with_suffix(".png").stat().st_size > 0
    assert "| tiny | grpo_fast | sdpa, " in data["markdown_table"]
    assert all(row["attention"].startswith("sdpa, ") for row in data["table"])


@pytest.mark.skipif(not HAS_TRL, reason="trl is not installed")
def test_quick_trl_does_the_same_work(quick_run):
    data, _ = quick_run
    assert data["environment"]["versions"]["trl"]
    ours, trl = _contender(data, "grpo_fast"), _contender(data, "trl")
    _check_contender(trl, data["settings"]["steps"])
    assert trl["trl_derived"]["generation_batch_size"] == step_config("tiny", quick=True).completions_per_step
    # measured by the reward function in each process: the same number of completions per optimizer step
    assert ours["summary"]["completions_per_step"] == trl["summary"]["completions_per_step"]
    row = next(r for r in data["table"] if r["contender"] == "grpo_fast")
    assert row["step_vs_trl"] > 0


def test_a_contender_past_its_timeout_is_named(tmp_path):
    """It ended the benchmark in a TimeoutExpired traceback, the table saying only that the run stopped."""
    from grpo_fast.bench.step.worker import run_contender

    job = {"contender": "trl", "config": {"name": "tiny"}}
    with pytest.raises(RuntimeError, match=r"^tiny/trl ran past --timeout 0.01 s; its log: .*log.txt$"):
        run_contender(job, tmp_path, timeout=0.01)


def test_a_second_run_under_the_same_work_directory(quick_run):
    """The trainer refused its own output of an earlier run under the same --work ("holds an earlier run"), so
    rerunning a documented command failed."""
    _, out = quick_run
    _quick(["grpo_fast"], out.parent / "again.json", out.parent / "work")

"""benchmarks/gpu_check.sh on a CPU machine: its dry run executes every phase's command line (tiny shapes) in the
GPU run's order and keeps the budget (at most 8 files, 6 of them JSON, nothing below $OUT; phase limits and
elapsed time within 480 s); the budget check itself fails when broken; and the GPU tests it runs import on an
image without the reward verifiers' dependencies."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
GPU_TESTS = [
    "tests/backends/test_native_gpu.py",
    "tests/backends/test_triton_gpu.py",
    "tests/trainer/test_offload_gpu.py",
    "tests/trainer/test_model_kernels.py",
]
PHASES = ["machine", "gate", "loss", "cuda", "n65536", "gpu_tests", "dw", "step", "trl_step", "model_kernels"]
ON_DEMAND = ["profile", "native", "profile_cuda", "liger"]  # the second check's phases: run only when ONLY names them
FILES = ["bench_loss_cpu.json", "dw_accumulation_cpu.json", "gpu_check.log", "model_kernels_cpu.json",
         "summary.json", "trainer_step_cpu.json", "trl_step_cpu.json"]  # fmt: skip


def _env(**extra) -> dict[str, str]:
    """This interpreter first on PATH, as `python3` (the script calls python3, like the GPU image)."""
    bin_dir = Path(sys.executable).parent
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **extra}


@pytest.mark.slow  # 84 s of CI's 20 minutes; run it (`scripts/test.sh -m slow`) before lending a GPU its one call
def test_dry_run_runs_every_phase_within_the_budget(tmp_path):
    assert shutil.which("python3", path=_env()["PATH"]).startswith(str(Path(sys.executable).parent))
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"], env=_env(OUT=str(tmp_path)), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == FILES
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [p["phase"] for p in summary["phases"]] == PHASES
    assert all(p["status"] == "0" for p in summary["phases"]), summary["phases"]
    assert sum(p["limit_s"] for p in summary["phases"]) <= 450 and summary["elapsed_s"] <= 3 * 480  # CPU slack
    assert summary["facts"]["budget"].startswith("budget kept: 7 files (6 JSON)")
    log = (tmp_path / "gpu_check.log").read_text()
    assert log.index("[gpu_check") < log.index("gate (limit") < log.index("loss (limit") < log.index("cuda (limit")
    loss = json.loads((tmp_path / "bench_loss_cpu.json").read_text())
    measured = {row["variant"] for row in loss["results"] if "median_s" in row}
    assert measured == {"gemm3", "triton", "torch", "naive", "trl", "liger", "cpu"}, loss["results"]
    assert len(loss["runs"]) == 2  # the loss and n65536 phases (cuda: no CUDA kernels on CPU) merged in one JSON
    for name in ("trainer_step_cpu.json", "trl_step_cpu.json", "dw_accumulation_cpu.json", "model_kernels_cpu.json"):
        assert json.loads((tmp_path / name).read_text()), name


def test_only_runs_the_named_phases(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], env=_env(OUT=str(tmp_path), ONLY="dw"),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    statuses = {p["phase"]: p["status"] for p in json.loads((tmp_path / "summary.json").read_text())["phases"]}
    assert statuses == {name: "0" if name in ("machine", "dw") else "not run (ONLY)" for name in PHASES}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dw_accumulation_cpu.json", "gpu_check.log", "summary.json"]


@pytest.mark.slow  # 90 s on 2 loaded cores
def test_second_check_runs_the_on_demand_phases_within_its_budget(tmp_path):
    """ONLY="profile native profile_cuda liger" BUDGET_S=195: the profile, the native tests, the cuda profile and
    Liger's row, in that order, each one's results kept; the full run's phases are listed as not run."""
    env = _env(OUT=str(tmp_path), ONLY=" ".join(ON_DEMAND), BUDGET_S="195")
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    statuses = {p["phase"]: p["status"] for p in summary["phases"]}
    assert statuses == {"machine": "0"} | {n: "not run (ONLY)" for n in PHASES[1:]} | dict.fromkeys(ON_DEMAND, "0")
    assert (
        summary["facts"]["budget"].startswith("budget kept: 4 files (3 JSON) in")
        and "limits 195s" in (summary["facts"]["budget"])
    )
    profile = json.loads((tmp_path / "profile_cpu.json").read_text())
    assert {"copy_gb_per_s", "read_gb_per_s"} <= set(profile["bandwidth"])
    timed = {name for name, row in profile["variants"].items() if "median_s" in row and row["profile"]["kernels"]}
    assert timed == {"gemm3", "triton", "torch", "trl", "cpu"}, profile["variants"]
    loss = json.loads((tmp_path / "bench_loss_cpu.json").read_text())
    assert {r["variant"] for r in loss["results"] if "median_s" in r} == {"gemm3", "cpu", "liger"}
    log = (tmp_path / "gpu_check.log").read_text()
    assert (
        log.index("profile (limit")
        < log.index("native (limit")
        < log.index("profile_cuda (limit")
        < log.index("liger (limit")
    )


def test_budget_check_fails_when_broken(tmp_path):
    def check(**env):
        return subprocess.run(["bash", str(SCRIPT), "--check-budget"], env=_env(OUT=str(tmp_path), **env),
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    kept = check()
    assert kept.returncode == 0 and "budget kept: 0 files" in kept.stdout and "limits 450s" in kept.stdout
    second = check(ONLY=" ".join(ON_DEMAND), BUDGET_S="195")  # the machine and the on-demand phases alone
    assert second.returncode == 0 and "limits 195s" in second.stdout, second.stdout
    for i in range(9):
        (tmp_path / f"r{i}.json").write_text("{}")
    (tmp_path / "deeper").mkdir()
    (tmp_path / "deeper" / "x.txt").write_text("")
    broken = check(BUDGET_S="400")
    assert broken.returncode == 1
    for problem in ("10 files in", "9 JSON files", "1 files below", "limits add up to 450s > 400s"):
        assert problem in broken.stdout, broken.stdout
    assert subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, timeout=60).returncode == 2


def test_gpu_tests_collect_without_the_verifiers_dependencies(tmp_path):
    """The GPU image has no math-verify or jsonschema: the GPU test files must still import."""
    for blocked in ("math_verify", "jsonschema"):
        (tmp_path / blocked).mkdir()
        (tmp_path / blocked / "__init__.py").write_text(f"raise ImportError('{blocked} is not installed here')\n")
    env = _env(PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *GPU_TESTS]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.fullmatch(r"\d+ tests collected in [\d.]+s", done.stdout.strip().splitlines()[-1]), done.stdout[-2000:]
    probe = "import grpo_fast.rewards, grpo_fast.trainer, grpo_fast.rewards.registry as r; r.REWARD_FUNCTIONS.names()"
    assert subprocess.run([sys.executable, "-c", probe], env=env, timeout=300).returncode == 0

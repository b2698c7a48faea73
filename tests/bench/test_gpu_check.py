"""benchmarks/gpu_check.sh on a CPU machine: its dry run executes every phase's command line (tiny shapes),
and the GPU tests it runs import on an image without the reward verifiers' dependencies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU_TESTS = [
    "tests/backends/test_native_gpu.py",
    "tests/backends/test_triton_gpu.py",
    "tests/trainer/test_offload_gpu.py",
]


def _env(**extra) -> dict[str, str]:
    """This interpreter first on PATH, as `python3` (the script calls python3, like the GPU image)."""
    bin_dir = Path(sys.executable).parent
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **extra}


def test_dry_run_writes_every_phase_s_results(tmp_path):
    assert shutil.which("python3", path=_env()["PATH"]).startswith(str(Path(sys.executable).parent))
    script = ROOT / "benchmarks" / "gpu_check.sh"
    done = subprocess.run(
        ["bash", str(script), "--dry-run"], env=_env(OUT=str(tmp_path)), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "exit status" not in done.stdout, done.stdout[-3000:]  # no phase failed
    assert "auto ->" in (tmp_path / "backends.txt").read_text()
    tests = (tmp_path / "gpu_tests.xml").read_text()
    assert 'errors="0"' in tests and 'failures="0"' in tests
    loss = json.loads((tmp_path / "bench_loss_cpu.json").read_text())
    assert {row["variant"] for row in loss["results"]} >= {"naive", "torch", "gemm3"}
    assert all("median_s" in row for row in loss["results"]), loss["results"]
    offload = json.loads((tmp_path / "offload_dry_run.json").read_text())
    assert offload["failures"] == []


def test_gpu_tests_collect_without_the_verifiers_dependencies(tmp_path):
    """The GPU image has no math-verify or jsonschema: the GPU test files must still import."""
    for blocked in ("math_verify", "jsonschema"):
        (tmp_path / blocked).mkdir()
        (tmp_path / blocked / "__init__.py").write_text(f"raise ImportError('{blocked} is not installed here')\n")
    env = _env(PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *GPU_TESTS]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "tests collected" in done.stdout and "error" not in done.stdout.lower()
    probe = "import grpo_fast.rewards, grpo_fast.trainer, grpo_fast.rewards.registry as r; r.REWARD_FUNCTIONS.names()"
    assert subprocess.run([sys.executable, "-c", probe], env=env, timeout=300).returncode == 0

"""The top-level kernels/ folder is the package grpo_fast.kernels, in every way the code is found: a copy of the
source tree on PYTHONPATH imports grpo_fast.kernels from that same copy (not from the tree grpo_fast was
installed from, whose editable finder maps grpo_fast.kernels), and setup.py builds kernels/ into
grpo_fast/kernels (the source tree's pointer file stays out of the build)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _copy_tree(dest: Path) -> Path:
    """grpo_fast/ and kernels/ of this tree copied under `dest` (without the built extension: not needed here)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so")
    shutil.copytree(ROOT / "grpo_fast", dest / "grpo_fast", ignore=ignore)
    shutil.copytree(ROOT / "kernels", dest / "kernels", ignore=ignore)
    return dest


def test_a_tree_on_pythonpath_imports_its_own_kernels(tmp_path):
    copy = _copy_tree(tmp_path / "copy")
    marker = "COPY_MARKER = 'this copy'\n"
    (copy / "kernels" / "grpo_token_loss.py").write_text((copy / "kernels" / "grpo_token_loss.py").read_text() + marker)
    script = (
        "import grpo_fast, grpo_fast.kernels.grpo_token_loss as k, grpo_fast.kernels.linear_logprobs as l;"
        "print(grpo_fast.__file__); print(k.__file__); print(l.__file__); print(k.COPY_MARKER)"
    )
    env = {**os.environ, "PYTHONPATH": str(copy), "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    package, token_loss, linear, found = out.stdout.split()[:3] + [out.stdout.split("\n")[3]]
    for path in (package, token_loss, linear):
        assert Path(path).resolve().is_relative_to(copy.resolve()), (path, copy)
    assert found == "this copy"


def test_setup_builds_kernels_into_the_package(tmp_path):
    build = tmp_path / "build"
    env = {**os.environ, "GRPO_FAST_SKIP_EXT": "1"}
    command = [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(build)]
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    built = build / "grpo_fast" / "kernels"
    assert (built / "grpo_token_loss.py").read_text() == (ROOT / "kernels" / "grpo_token_loss.py").read_text()
    assert (built / "__init__.py").read_text() == (ROOT / "kernels" / "__init__.py").read_text()  # not the pointer
    assert (build / "grpo_fast" / "loss" / "objectives" / "icepop.py").exists()

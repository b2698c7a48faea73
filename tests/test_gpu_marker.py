"""tests/conftest.py skips the tests marked `gpu` when there is no CUDA device, and only those: a checkout in a
directory named `gpu` (whose name every test's keywords carry) must still run its CPU tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CONFTEST = Path(__file__).with_name("conftest.py")
TESTS = """
import pytest

def test_cpu():
    pass

@pytest.mark.gpu
def test_gpu():
    pass
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gpu test runs where there is a GPU")
def test_only_gpu_marked_tests_are_skipped_in_a_directory_named_gpu(tmp_path):
    root = tmp_path / "gpu"
    root.mkdir()
    shutil.copy(CONFTEST, root / "conftest.py")
    (root / "test_both.py").write_text(TESTS)
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a CUDA device\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(root)]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
    assert "1 passed, 1 skipped" in done.stdout, done.stdout[-2000:]

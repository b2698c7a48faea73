"""`grpo-fast demo` (and every command) prints our own lines only by default: vLLM's INFO lines, a few per training
step (weights reloaded, prefix cache reset), stay off; --verbose (--log-level info) shows them."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

VLLM_INFO = re.compile(r"\bINFO \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\]")  # INFO 12-04 17:14:58 [file.py:12]
VLLM_LINE = re.compile(r"\b(INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\]")


def _demo(tmp_path, *flags: str) -> str:
    command = [sys.executable, "-m", "grpo_fast.cli", "demo", "--output-dir", str(tmp_path / "demo"), "--no-progress"]
    command += ["--sft-steps", "4", "--rl-steps", "2", *flags]
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out accuracy:" in proc.stdout
    return proc.stdout + proc.stderr


def test_the_demo_prints_no_vllm_info_line_unless_verbose(tmp_path):
    quiet = _demo(tmp_path)
    assert not VLLM_LINE.search(quiet), [line for line in quiet.splitlines() if VLLM_LINE.search(line)][:5]
    others = ("Writing model shards", "Loading safetensors", "FutureWarning", "Disabling Triton")  # progress, notices
    assert not [line for line in quiet.splitlines() if line.startswith(others) or any(o in line for o in others)]
    verbose = _demo(tmp_path, "--verbose")
    assert len(VLLM_INFO.findall(verbose)) >= 5  # the engine's start-up and each weight reload
    assert "best held-out accuracy" in verbose  # and our own INFO lines

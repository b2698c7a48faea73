"""A model the Hugging Face Hub cannot give ends `grpo-fast train` in one line that names model.path, the model, why
and what to do, at once: no retries, no traceback, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _train(tmp_path, model: str, **env) -> subprocess.CompletedProcess:
    out = tmp_path / "run"
    command = [sys.executable, "-m", "grpo_fast.cli", "train", "--set", f"model.path={model}"]
    command += ["--set", f"run.output_dir={out}", "--set", "run.report_to=[]", "--set", "data.task_kwargs={n: 8}"]
    environment = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    environment |= {"HF_HOME": str(tmp_path / "hf"), **env}  # an empty cache
    proc = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and not out.exists(), proc.stderr[-2000:]
    return proc


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr and "Retrying" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-0.5B-Instruct", "no-such-org/no-such-model-grpo-fast"])
def test_offline_a_hub_model_not_in_the_cache_is_one_line(tmp_path, model):
    proc = _train(tmp_path, model, HF_HUB_OFFLINE="1")
    line = _one_line(proc)
    assert f"model.path: {model} could not be loaded: HF_HUB_OFFLINE is set" in line
    assert "hf download" in line and "local model directory" in line


def test_an_unreachable_hub_is_one_line_after_one_request(tmp_path):
    # Nothing listens on port 9 of this host: every request is refused at once, as with no network.
    proc = _train(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct", HF_ENDPOINT="http://127.0.0.1:9")
    line = _one_line(proc)
    assert "model.path: Qwen/Qwen2.5-0.5B-Instruct could not be loaded: the Hugging Face Hub" in line
    assert "cannot be reached" in line and "HF_HUB_OFFLINE=1" in line and "local model directory" in line

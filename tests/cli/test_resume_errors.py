"""`grpo-fast train --resume` from a checkpoint the safe loader refuses ends in one line that names the checkpoint
and why, like the other config errors: no traceback, and nothing of the refused checkpoint runs or is changed."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
import yaml

from grpo_fast.core import checkpoint as ckpt
from grpo_fast.testing.configs import quiet_run_config


class _CreatesAFile:
    """Unpickling this opens (creates) `path`: what a malicious checkpoint would do, harmlessly."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _train(config, out, *flags) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "grpo_fast.cli", "train", "--config", str(config), "--skip-checks"]
    command += ["--set", f"run.output_dir={out}", *flags]
    env = os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def test_resume_from_a_refused_checkpoint_is_one_line(tmp_path, tiny_dir):
    out, marker, config = tmp_path / "run", tmp_path / "pwned", tmp_path / "config.yaml"
    rollout = {"engine": "hf", "num_generations": 2, "max_completion_length": 2}
    run = {"max_steps": 1, "prompts_per_step": 1}
    config.write_text(yaml.safe_dump(quiet_run_config(tiny_dir, reward={"workers": 0}, rollout=rollout, run=run)))
    first = _train(config, out)
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = ckpt.latest_checkpoint(out / "checkpoints")
    state = ckpt.load_trainer_state(checkpoint)
    torch.save({**state, "extra": _CreatesAFile(marker)}, checkpoint / ckpt.TRAINER_STATE)
    tampered = (checkpoint / ckpt.TRAINER_STATE).read_bytes()

    proc = _train(config, out, "--resume", "--set", "run.max_steps=2")
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("Loading weights")]
    assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[0].startswith(f"grpo-fast train: cannot resume from {checkpoint}:"), lines[0]
    assert (
        f"refused, its files differ from the manifest its writer left ({ckpt.MANIFEST}): {ckpt.TRAINER_STATE}"
        in (lines[0])
    )
    assert not marker.exists() and (checkpoint / ckpt.TRAINER_STATE).read_bytes() == tampered
    assert ckpt.latest_checkpoint(out / "checkpoints") == checkpoint  # no step was trained from it


def test_a_fresh_start_over_an_earlier_run_is_refused_in_one_line_before_anything_starts(tmp_path, tiny_dir):
    out, config = tmp_path / "run", tmp_path / "config.yaml"
    rollout = {"engine": "hf", "num_generations": 2, "max_completion_length": 2}
    run = {"max_steps": 1, "prompts_per_step": 1}
    config.write_text(yaml.safe_dump(quiet_run_config(tiny_dir, reward={"workers": 0}, rollout=rollout, run=run)))
    assert _train(config, out).returncode == 0
    proc = _train(config, out)  # neither --resume nor --overwrite
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("Loading weights")]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines == [lines[0]] and lines[0].startswith(f"grpo-fast train: run.output_dir {out} holds an earlier run")


def test_sft_resume_from_a_refused_checkpoint_is_one_line(tmp_path, tiny_dir):
    """grpo-fast sft printed UnsafeCheckpointError's traceback where train prints one line."""
    out, marker, rows = tmp_path / "run", tmp_path / "pwned", tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1=", "completion": "2"}\n' * 4)
    command = [sys.executable, "-m", "grpo_fast.cli", "sft", "--set", f"model.path={tiny_dir}"]
    command += ["--set", f"data.source={rows}", "--set", f"run.output_dir={out}", "--set", "run.progress=false"]
    command += ["--set", "run.plots=false", "--set", "run.save_every=1"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    first = subprocess.run([*command, "--set", "run.max_steps=1"], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = ckpt.latest_checkpoint(out / "checkpoints")
    state = ckpt.load_trainer_state(checkpoint)
    torch.save({**state, "extra": _CreatesAFile(marker)}, checkpoint / ckpt.TRAINER_STATE)
    proc = subprocess.run(
        [*command, "--set", "run.max_steps=2", "--resume"], env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("Loading weights")]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[-1].startswith("grpo-fast sft: ") and ckpt.MANIFEST in lines[-1], lines
    assert not marker.exists()

"""A real one-step run's checkpoint, then altered as an attacker with write access to it would alter it: a
`sharded/` directory added whose DCP shards carry a pickle payload in a non-tensor entry (the optimizer's
learning rate), with the manifest left as it was, rewritten to list the shards, or with the trainer state also
rewritten to claim several ranks wrote it. Each resume is refused before the payload runs (the payload would
create a marker file and hand back the learning rate, so that the run went on as if nothing happened), and the
checkpoint is left byte for byte as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from grpo_fast.core import checkpoint as ckpt
from grpo_fast.core.sharded_checkpoint import SHARDED_DIR, save_sharded
from grpo_fast.testing.configs import quiet_run_config


class _TouchesAFile:
    """Unpickled, creates `marker` and returns `value`: what a payload that lets the run go on would do."""

    def __init__(self, marker: Path, value: float) -> None:
        self.marker, self.value = str(marker), value

    def __reduce__(self):
        return eval, (f"__import__('pathlib').Path({self.marker!r}).touch() or {self.value!r}",)


def _config(tmp_path: Path, model_dir: Path) -> Path:
    cfg = quiet_run_config(
        model_dir,
        reward={"funcs": ["exact_match"], "workers": 0},
        rollout={"engine": "hf", "num_generations": 2, "max_completion_length": 2},
        run={"max_steps": 1, "prompts_per_step": 2},
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _trainer(config: Path, out: Path, *overrides: str):
    from grpo_fast.cli.train import trainer_from_config
    from grpo_fast.trainer import load_config

    return trainer_from_config(load_config(config, [f"run.output_dir={out}", *overrides]))


@pytest.fixture
def crafted(tmp_path, tiny_dir):
    """(config, output dir, step-1 checkpoint, marker): a one-step run whose checkpoint gained a `sharded/`
    directory with the run's own model and optimizer, its learning rate a payload."""
    config, out, marker = _config(tmp_path, tiny_dir), tmp_path / "run", tmp_path / "payload-ran"
    trainer = _trainer(config, out)
    try:
        trainer.train()
        path = out / "checkpoints" / "step-000001"
        group = trainer.optimizer.param_groups[0]
        group["lr"] = _TouchesAFile(marker, group["lr"])
        save_sharded(path / SHARDED_DIR, trainer.model, trainer.optimizer)
    finally:
        trainer.close()
    assert not marker.exists()
    return config, out, path, marker


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _write_manifest(path: Path) -> None:
    """The manifest an attacker writes to match the altered directory."""
    sizes = {str(p.relative_to(path)): p.stat().st_size for p in path.rglob("*") if p.is_file()}
    sizes.pop(ckpt.MANIFEST)
    (path / ckpt.MANIFEST).write_text(json.dumps(sizes))


def _assert_resume_refused(config: Path, out: Path, path: Path, marker: Path, match: str) -> None:
    """Resuming in process from `path` raises UnsafeCheckpointError matching `match`; the payload never ran
    and the checkpoint's files are left as they were."""
    before = _files(path)
    trainer = _trainer(config, out, "run.max_steps=2", "run.resume=true")
    try:
        with pytest.raises(ckpt.UnsafeCheckpointError, match=match):
            trainer.train()
    finally:
        trainer.close()
    assert not marker.exists() and _files(path) == before


def test_resume_through_the_cli_refuses_a_crafted_sharded_directory_unread(crafted):
    config, out, path, marker = crafted
    before = _files(path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-c", "import sys; from grpo_fast.cli import main; sys.exit(main(sys.argv[1:]))"]
    cmd += ["train", "--config", str(config), "--skip-checks", "--resume"]
    cmd += ["--set", f"run.output_dir={out}", "--set", "run.max_steps=2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, proc.stderr[-3000:]
    refusal = [line for line in proc.stderr.splitlines() if line.startswith("grpo-fast train: cannot resume from")]
    assert len(refusal) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]  # one line, as config errors
    assert f"{SHARDED_DIR}/.metadata: not written by the trainer" in refusal[0], proc.stderr[-3000:]
    assert not marker.exists()  # the payload never ran
    assert _files(path) == before  # the user's checkpoint is left as it was
    assert ckpt.saved_steps(out / "checkpoints") == [1]  # and no step was trained on it


def test_a_one_process_checkpoint_with_shards_is_refused_even_with_a_matching_manifest(crafted):
    config, out, path, marker = crafted
    _write_manifest(path)
    _assert_resume_refused(config, out, path, marker, match="one process wrote it")


def test_shards_claimed_by_the_trainer_state_load_their_plain_values_only(crafted):
    """The attacker rewrites the trainer state too (plain values, so weights_only reads it) to say several ranks
    wrote the checkpoint: the shards are read, and their payload entry refused by the weights_only planner."""
    config, out, path, marker = crafted
    _write_manifest(path)
    state = ckpt.load_trainer_state(path)
    del state["optimizer"]
    torch.save(state, path / ckpt.TRAINER_STATE)
    _write_manifest(path)
    _assert_resume_refused(config, out, path, marker, match="param_groups.*lr.*refused")

"""`run.keep_checkpoints`: the last K checkpoints stay, older ones go, and the one a run resumed from is
never deleted by that run."""

from __future__ import annotations

import shutil

import pytest
import torch
from tiny_trainer import tiny_trainer

from grpo_fast.core import checkpoint as ckpt
from grpo_fast.trainer import load_config


def _trainer(out, *overrides):
    return tiny_trainer(out, "run.save_every=1", *overrides)


def _names(out):
    return [p.name for p in ckpt.list_checkpoints(out / "checkpoints")]


def test_keep_checkpoints_keeps_the_last_k(tmp_path):
    out = tmp_path / "run"
    trainer = _trainer(out, "run.max_steps=3", "run.keep_checkpoints=2")
    trainer.train()
    trainer.close()
    assert _names(out) == ["step-000002", "step-000003"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == _names(out)  # no temp dirs left


def test_the_default_keeps_every_checkpoint(tmp_path):
    out = tmp_path / "run"
    trainer = _trainer(out, "run.max_steps=3")
    assert trainer.config.run.keep_checkpoints is None
    trainer.train()
    trainer.close()
    assert _names(out) == ["step-000001", "step-000002", "step-000003"]


def test_the_checkpoint_resumed_from_is_never_pruned(tmp_path):
    out = tmp_path / "run"
    first = _trainer(out, "run.max_steps=2")
    first.train()
    first.close()
    shutil.rmtree(out / "checkpoints" / "step-000002")  # resume from step 1: the killed run's last checkpoint
    resumed = _trainer(out, "run.max_steps=4", "run.resume=true", "run.keep_checkpoints=1")
    resumed.train()
    resumed.close()
    assert _names(out) == ["step-000001", "step-000004"]


def test_save_checkpoint_protects_the_paths_it_is_told_to_keep(tmp_path):
    class _Model:
        def save_pretrained(self, path, safe_serialization=True):
            torch.save(torch.zeros(1), path / "weights.pt")

    root = tmp_path / "checkpoints"
    first = ckpt.save_checkpoint(root, 1, _Model(), None, {"step": 1})
    for step in (2, 3, 4):
        ckpt.save_checkpoint(root, step, _Model(), None, {"step": step}, keep=2, protect=[first])
    assert [p.name for p in ckpt.list_checkpoints(root)] == ["step-000001", "step-000003", "step-000004"]


@pytest.mark.parametrize("value", [0, -1])
def test_keep_checkpoints_must_be_positive(value):
    with pytest.raises(ValueError, match="run.keep_checkpoints: expected a value >= 1"):
        load_config(None, [f"run.keep_checkpoints={value}"])

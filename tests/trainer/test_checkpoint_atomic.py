"""A crash in the middle of re-saving a step never loses the checkpoint that was already there."""

from __future__ import annotations

import pytest
import torch

from grpo_fast.core import checkpoint as ckpt


class _Model:
    def __init__(self, value: float) -> None:
        self.value = value

    def save_pretrained(self, path, safe_serialization=True):
        torch.save(torch.tensor(self.value), path / "weights.pt")


def test_crash_between_renames_of_a_resave_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    ckpt.save_checkpoint(root, 5, _Model(1.0), None, {"step": 5})
    real_replace = ckpt.os.replace
    calls = []

    def crashing_replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # step-5 moved aside, the new one not yet renamed in
            raise KeyboardInterrupt("killed")
        real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", crashing_replace)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(root, 5, _Model(2.0), None, {"step": 5})
    monkeypatch.setattr(ckpt.os, "replace", real_replace)

    latest = ckpt.latest_checkpoint(root)
    assert latest == root / "step-000005"
    assert float(torch.load(latest / "weights.pt")) == 1.0
    assert ckpt.load_trainer_state(latest)["step"] == 5
    ckpt.save_checkpoint(root, 5, _Model(3.0), None, {"step": 5})  # and the next save still works
    assert float(torch.load(ckpt.latest_checkpoint(root) / "weights.pt")) == 3.0
    assert not [p for p in root.iterdir() if p.name.startswith(".old-")]

"""`save()` writes the optimizer state from where it is: while it is offloaded (GPU runs, between steps) that
is the offloader's pinned CPU copies, so a checkpoint never brings it back onto the GPU."""

from __future__ import annotations

import pytest
import torch
from tiny_trainer import tiny_trainer

from grpo_fast.core import checkpoint as ckpt


def _trainer(out, *overrides, device="cpu"):
    return tiny_trainer(out, "run.save_final=false", *overrides, device=device)


def _optimizer_tensors(state_dict):
    return {(i, k): v for i, s in state_dict["state"].items() for k, v in s.items() if torch.is_tensor(v)}


def test_save_writes_offloaded_state_from_its_cpu_copies_without_reloading(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path / "run", "run.max_steps=1")
    trainer.train()
    trainer.close()
    # What TrainerStateOffloader.offload leaves behind: the state tensors replaced by CPU copies, offloaded set.
    for state in trainer.optimizer.state.values():
        for key, value in state.items():
            state[key] = value.clone()
    copies = _optimizer_tensors(trainer.optimizer.state_dict())
    trainer.offloader.offloaded = True

    def reload():
        raise AssertionError("save() must not bring offloaded state back to the device")

    monkeypatch.setattr(trainer.offloader, "reload", reload)
    monkeypatch.setattr(trainer.offloader, "offload", reload)
    path = trainer.save()

    assert trainer.offloader.offloaded
    assert _optimizer_tensors(trainer.optimizer.state_dict()).keys() == copies.keys()
    for key, value in _optimizer_tensors(trainer.optimizer.state_dict()).items():
        assert value is copies[key]  # still the offloader's copies, not new tensors
    saved = _optimizer_tensors(ckpt.load_trainer_state(path)["optimizer"])
    for key, value in copies.items():
        assert torch.equal(saved[key], value), key


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_saving_an_offloaded_run_allocates_no_gpu_memory(tmp_path):
    trainer = _trainer(tmp_path / "run", "run.max_steps=1", "run.offload_optimizer=true", device="cuda")
    trainer.train()
    assert trainer.offloader.offloaded
    before = _optimizer_tensors(trainer.optimizer.state_dict())
    assert all(not v.is_cuda for v in before.values())
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    path = trainer.save()
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() <= allocated + (1 << 20)
    assert trainer.offloader.offloaded
    saved = _optimizer_tensors(ckpt.load_trainer_state(path)["optimizer"])
    for key, value in before.items():
        assert torch.equal(saved[key], value.cpu()), key
    resumed = _trainer(tmp_path / "run", "run.max_steps=1", "run.resume=true", device="cuda")
    assert resumed.resume()
    for key, value in _optimizer_tensors(resumed.optimizer.state_dict()).items():
        assert torch.equal(value.cpu(), before[key].cpu()), key
    trainer.close()
    resumed.close()

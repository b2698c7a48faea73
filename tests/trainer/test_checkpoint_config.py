"""Resuming compares the run's config with the checkpoint's: a change to the model, the loss or the batch
shape is refused with the keys and both values; cadence, logging and output options may change (logged)."""

from __future__ import annotations

import json
import logging

import pytest
from tiny_trainer import tiny_trainer

from grpo_fast.core import checkpoint as ckpt
from grpo_fast.trainer import load_config


def _trainer(out, *overrides):
    return tiny_trainer(out, *overrides)


@pytest.fixture
def saved_run(tmp_path):
    out = tmp_path / "run"
    trainer = _trainer(out, "run.max_steps=1")
    trainer.train()
    trainer.close()
    return out


def test_the_checkpoint_keeps_the_config_as_json(saved_run):
    saved = json.loads((saved_run / "checkpoints" / "step-000001" / "train_config.json").read_text())
    assert saved["config"]["rollout"]["num_generations"] == 2 and saved["lora"] is None


def test_an_incompatible_change_is_refused_with_the_keys_and_both_values(saved_run):
    changed = ["rollout.num_generations=4", "run.prompts_per_step=3", "loss.loss_type=dr_grpo"]
    trainer = _trainer(saved_run, "run.max_steps=2", "run.resume=true", *changed)
    with pytest.raises(ValueError, match="cannot resume") as info:
        trainer.train()
    message = str(info.value)
    for line in (
        "rollout.num_generations: saved 2, now 4",
        "run.prompts_per_step: saved 2, now 3",
        "loss.loss_type: saved 'dapo', now 'dr_grpo'",
    ):
        assert line in message
    assert trainer.step == 0  # nothing was loaded


def test_harmless_changes_are_allowed_and_logged(saved_run, caplog):
    harmless = ["run.max_steps=2", "run.log_every=2", "run.save_every=1", "run.keep_checkpoints=3", "run.eval_every=5"]
    trainer = _trainer(saved_run, "run.resume=true", *harmless)
    with caplog.at_level(logging.INFO, logger="grpo_fast"):
        trainer.train()
    trainer.close()
    assert trainer.step == 2
    logged = caplog.text
    assert "run.max_steps: saved 1, now 2" in logged and "run.keep_checkpoints: saved None, now 3" in logged


def test_a_resume_trains_with_the_new_optimizer_options_it_reports(saved_run):
    """The saved optimizer and scheduler states brought back the saved lr, weight decay, betas and eps, while the
    log said the new ones change the training from here on."""
    seen = []
    changed = ["optim.lr=1e-6", "optim.weight_decay=0.3", "optim.beta1=0.5", "optim.eps=1e-6"]
    trainer = _trainer(saved_run, "run.max_steps=2", "run.resume=true", *changed)
    trainer.callbacks.append(lambda t, rollout, metrics: seen.append(dict(t.optimizer.param_groups[0])))
    trainer.train()
    trainer.close()
    (group,) = seen
    assert (group["lr"], group["weight_decay"], group["betas"], group["eps"]) == (1e-6, 0.3, (0.5, 0.99), 1e-6)
    assert trainer.scheduler.base_lrs == [1e-6]


def test_a_resume_that_finds_only_an_incomplete_checkpoint_refuses_and_deletes_nothing(saved_run):
    """It was taken for the run's progress from before its first checkpoint: checkpoints/ deleted, step 0 again."""
    (checkpoint,) = (saved_run / "checkpoints").iterdir()
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # cut short
    trainer = _trainer(saved_run, "run.max_steps=2", "run.resume=true")
    with pytest.raises(ValueError, match=r"holds no complete checkpoint, only incomplete ones \(steps 1: files"):
        trainer.train()
    trainer.close()
    assert checkpoint.is_dir() and weights.exists() and (saved_run / "metrics.jsonl").exists()


def test_compare_configs_sorts_changes_into_refused_harmless_and_other():
    saved = {"config": load_config(None, []).to_dict(), "lora": None}
    new = {"config": load_config(None, ["run.micro_batch_size=8", "run.plots=false", "optim.lr=1e-3"]).to_dict()}
    new["lora"] = {"r": 4}
    diff = ckpt.compare_configs(saved, new)
    assert [c.key for c in diff.incompatible] == ["lora"]
    assert [c.key for c in diff.harmless] == ["run.plots"]
    # micro-batches: the same gradient but for bnpo's and the entropy bonus's per-micro-batch means (TRL's), so a
    # smaller one after running out of memory resumes, warned as changing the training
    assert [c.key for c in diff.other] == ["optim.lr", "run.micro_batch_size"]


def test_a_new_max_steps_under_a_decaying_schedule_is_reported_as_changing_the_training():
    saved = {"config": load_config(None, ["optim.lr_scheduler=cosine"]).to_dict()}
    new = {"config": load_config(None, ["optim.lr_scheduler=cosine", "run.max_steps=200"]).to_dict()}
    diff = ckpt.compare_configs(saved, new)
    assert [str(c) for c in diff.other] == ["run.max_steps: saved 100, now 200"] and not diff.harmless


def test_a_checkpoint_from_before_train_config_json_is_checked_against_its_trainer_state(tmp_path):
    import torch

    path = tmp_path / "step-000001"
    path.mkdir()
    torch.save({"step": 1, "config": load_config(None, []).to_dict()}, path / "trainer_state.pt")
    new = ckpt.run_signature(load_config(None, ["rollout.num_generations=4"]).to_dict(), model=None)
    with pytest.raises(ValueError, match="rollout.num_generations: saved 8, now 4"):
        ckpt.check_resume_config(path, new)

"""A run killed after step k and resumed ends exactly where the uninterrupted run ends: the same model
weights, optimizer state and learning-rate schedule, bit for bit (CPU, transformers engine). Attention
dropout is on, so training draws random numbers (the transformers engine re-seeds torch at every
generation; an engine that does not leaves them to the restored RNG states), and the learning rate follows a
linear schedule with warmup, so the schedule's position matters too."""

from __future__ import annotations

import pytest
import torch

from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rewards.text import completion_text
from grpo_fast.testing.trees import assert_equal_trees
from grpo_fast.trainer import GRPOTrainer, load_config

STEPS, KILLED_AFTER = 3, 1


def char_code_reward(prompts, completions, **_):
    """A deterministic reward that differs between completions, so every step has a gradient."""
    return [sum(map(ord, completion_text(c))) % 7 / 6 for c in completions]


def _trainer(out, *overrides, callbacks=()):
    tok = build_char_tokenizer()
    opts = ["rollout.engine=hf", "rollout.num_generations=4", "rollout.max_completion_length=3"]
    opts += ["run.prompts_per_step=2", "run.micro_batch_size=4", "run.eval_every=0", "reward.workers=0"]
    opts += ["run.tensorboard=false", "run.progress=false", "run.plots=false", "run.save_every=1"]
    opts += [f"run.max_steps={STEPS}", "optim.lr=1e-2", "optim.lr_scheduler=linear", "optim.warmup_steps=1"]
    opts += ["grpo.num_iterations=2", f"run.output_dir={out}", *overrides]
    rows = modular_arithmetic_dataset(16, seed=0)
    model = build_tiny_model(tok)
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.1
    cfg = load_config(None, opts)
    return GRPOTrainer(model, [char_code_reward], rows, config=cfg, tokenizer=tok, callbacks=callbacks)


class _Killed(Exception):
    pass


def _kill_after(step):
    def callback(trainer, rollout, metrics):
        if trainer.step == step:  # in the step after `step`, whose checkpoint is on disk
            raise _Killed

    return callback


def _run(trainer):
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


def test_k_steps_then_resume_equals_the_uninterrupted_run(tmp_path):
    full = _run(_trainer(tmp_path / "full"))

    with pytest.raises(_Killed):
        _run(_trainer(tmp_path / "split", callbacks=[_kill_after(KILLED_AFTER)]))
    resumed = _run(_trainer(tmp_path / "split", "run.resume=true"))

    assert resumed.step == full.step == STEPS
    init = build_tiny_model(build_char_tokenizer())
    moved = [not torch.equal(p, q) for p, q in zip(full.model.parameters(), init.parameters(), strict=True)]
    assert all(moved)  # every step had a gradient: the comparison below is not between untouched weights
    assert_equal_trees(dict(resumed.model.named_parameters()), dict(full.model.named_parameters()), "model")
    assert_equal_trees(resumed.optimizer.state_dict(), full.optimizer.state_dict(), "optimizer")
    assert_equal_trees(resumed.scheduler.state_dict(), full.scheduler.state_dict(), "scheduler")
    assert resumed.sampler.state_dict() == full.sampler.state_dict()
    assert resumed.optimizer.param_groups[0]["lr"] == full.optimizer.param_groups[0]["lr"]


PARTIAL = (
    "rollout.mode=partial",
    "rollout.max_completion_length=6",
    "rollout.partial.segment_tokens=1",
    "rollout.partial.groups_in_flight=3",
    "rollout.stop=['0','1','2','3','4','5','6','7','8','9','=','+']",  # lengths that differ: groups finish apart
)


def test_partial_rollouts_resume_with_the_completions_under_way(tmp_path):
    """rollout.mode partial: the checkpoint keeps the completions under way, and the resumed run continues them
    (same tokens, same weight versions) to the uninterrupted run's weights, bit for bit."""
    full = _run(_trainer(tmp_path / "full", *PARTIAL))

    with pytest.raises(_Killed):
        _run(_trainer(tmp_path / "split", *PARTIAL, callbacks=[_kill_after(KILLED_AFTER)]))
    from grpo_fast.core.checkpoint import latest_checkpoint, load_trainer_state

    state = load_trainer_state(latest_checkpoint(tmp_path / "split" / "checkpoints"))
    members = [m for g in state["partial_rollouts"]["groups"] for m in g["members"]]
    assert any(m["finish_reason"] is None and m["token_ids"] for m in members), "nothing was under way"
    resumed = _run(_trainer(tmp_path / "split", *PARTIAL, "run.resume=true"))

    assert resumed.step == full.step == STEPS
    assert_equal_trees(dict(resumed.model.named_parameters()), dict(full.model.named_parameters()), "model")
    assert_equal_trees(resumed.optimizer.state_dict(), full.optimizer.state_dict(), "optimizer")
    assert resumed.rollout.partial.groups == full.rollout.partial.groups

"""A step whose loss or gradient is NaN/inf is skipped: parameters and optimizer state stay bit-identical,
`train/nonfinite` and `train/skipped_steps` report it, no checkpoint is written for it, and the run goes
on; run.max_bad_steps bad steps in a row stop the run with an error naming the option, the last good
checkpoint kept. The NaN comes through a real path: a forward hook on the policy's embeddings that poisons
the training forward (train mode) of chosen steps; generation and the old-logprob pass run in eval mode
and stay finite."""

from __future__ import annotations

import copy
import json
import logging

import pytest
import torch

from grpo_fast.core.checkpoint import list_checkpoints, load_model_weights, load_trainer_state
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rewards.text import completion_text
from grpo_fast.testing.trees import assert_equal_trees
from grpo_fast.trainer import GRPOTrainer, load_config


def char_code_reward(prompts, completions, **_):
    return [sum(map(ord, completion_text(c))) % 7 / 6 for c in completions]


def _trainer(out, bad_steps, *overrides, callbacks=()):
    tok = build_char_tokenizer()
    opts = ["rollout.engine=hf", "rollout.num_generations=4", "rollout.max_completion_length=3"]
    opts += ["run.prompts_per_step=2", "run.micro_batch_size=4", "run.eval_every=0", "reward.workers=0"]
    opts += ["run.tensorboard=false", "run.progress=false", "run.plots=false", "run.save_every=1"]
    opts += ["optim.lr=1e-2", f"run.output_dir={out}", *overrides]
    model = build_tiny_model(tok)
    trainer = GRPOTrainer(
        model,
        [char_code_reward],
        modular_arithmetic_dataset(16, seed=0),
        config=load_config(None, opts),
        tokenizer=tok,
        callbacks=callbacks,
    )

    def poison(module, args, output):  # the training forward of the chosen steps only
        if module.training and trainer.step in bad_steps:
            return output * float("nan")
        return None

    model.get_input_embeddings().register_forward_hook(poison)
    return trainer


def _snapshot(trainer):
    return (
        {k: v.detach().clone() for k, v in trainer.model.named_parameters()},
        copy.deepcopy(trainer.optimizer.state_dict()),
    )


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("iterations", [1, 2])
def test_a_nonfinite_step_is_skipped_and_the_run_goes_on(tmp_path, caplog, iterations):
    snapshots = {}

    def watch(trainer, rollout, metrics):  # after each step's update, before trainer.step advances
        snapshots[trainer.step] = _snapshot(trainer)

    out = tmp_path / "run"
    t = _trainer(out, {1}, "run.max_steps=3", f"grpo.num_iterations={iterations}", callbacks=[watch])
    with caplog.at_level(logging.WARNING, logger="grpo_fast"):
        try:
            t.train()
        finally:
            t.close()
    assert t.step == 3
    # Step 1 (the second) was skipped: its update left the weights and optimizer state as step 0 left them.
    params0, optim0 = snapshots[0]
    params1, optim1 = snapshots[1]
    assert_equal_trees(params1, params0, "model")
    assert_equal_trees(optim1, optim0, "optimizer")
    assert not all(torch.equal(params0[k], v) for k, v in snapshots[2][0].items())  # step 2 trained again
    rows = _metrics(out)
    assert [r["train/nonfinite"] for r in rows] == [0.0, float(iterations), 0.0]
    assert [r["train/skipped_steps"] for r in rows] == [0.0, 1.0, 1.0]
    assert any("non-finite" in r.message for r in caplog.records)
    # No checkpoint for the skipped step; the others were written.
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == ["step-000001", "step-000003"]


def test_max_bad_steps_in_a_row_stop_the_run_keeping_the_last_good_checkpoint(tmp_path):
    out = tmp_path / "run"
    t = _trainer(out, {2, 3, 4, 5}, "run.max_steps=6", "run.max_bad_steps=2")
    good = {}
    t.callbacks.append(lambda tr, rollout, m: good.setdefault(tr.step, _snapshot(tr)) if tr.step == 1 else None)
    with pytest.raises(RuntimeError, match=r"run\.max_bad_steps"):
        try:
            t.train()
        finally:
            t.close()
    assert t.step == 4  # steps 3 and 4 (indices 2, 3) were bad: stopped after the second
    ckpts = list_checkpoints(out / "checkpoints")
    assert [p.name for p in ckpts] == ["step-000001", "step-000002"]
    params, optim = good[1]
    assert_equal_trees(dict(t.model.named_parameters()), params, "model")  # the bad steps changed nothing
    reloaded = build_tiny_model(build_char_tokenizer(), seed=1)
    load_model_weights(reloaded, ckpts[-1])
    assert_equal_trees(dict(reloaded.named_parameters()), params, "checkpoint")
    assert_equal_trees(load_trainer_state(ckpts[-1])["optimizer"], optim, "checkpoint optimizer")
    rows = _metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["train/skipped_steps"] == 2.0


def test_max_bad_steps_is_validated():
    with pytest.raises(ValueError, match=r"run\.max_bad_steps"):
        load_config(None, ["run.max_bad_steps=-1"])

"""rollout.mode async in whole training runs (the transformers engine in its own process, spawned by the trainer or
started apart): every step trains prompts_per_step whole groups within max_staleness versions, and a run killed
mid-way resumes without training any group twice (the groups under way at the kill are discarded, their prompts
skipped)."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys

import pytest
from scoring_verifiers import even_operand, flat_on_even_operands, global_step_slowly

from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rewards.text import completion_text
from grpo_fast.trainer import GRPOTrainer, load_config

STEPS, MAX_STALENESS = 5, 1


def char_code_reward(prompts, completions, **_):
    """A deterministic reward that differs between completions, so every step has a gradient."""
    return [sum(map(ord, completion_text(c))) % 7 / 6 for c in completions]


def _trainer(out, *overrides, callbacks=(), rewards=(char_code_reward,)):
    tok = build_char_tokenizer()
    opts = ["rollout.mode=async", "rollout.engine=hf", "rollout.num_generations=3", "rollout.max_completion_length=8"]
    opts += ["rollout.partial.segment_tokens=2", f"rollout.max_staleness={MAX_STALENESS}", "rollout.stale=drop"]
    opts += ["rollout.async_engine.threads=1", "rollout.async_engine.timeout_seconds=120"]
    opts += ["run.prompts_per_step=2", "run.eval_every=0", "reward.workers=0", "run.report_to=[]"]
    opts += ["run.progress=false", "run.plots=false", "run.save_every=1", f"run.max_steps={STEPS}", "optim.lr=1e-2"]
    opts += [f"run.output_dir={out}", *overrides]
    rows = modular_arithmetic_dataset(64, seed=0)  # more rows than the run draws: a row trained twice is a bug
    cfg = load_config(None, opts)
    return GRPOTrainer(build_tiny_model(tok), list(rewards), rows, config=cfg, tokenizer=tok, callbacks=callbacks)


class _Ledger:
    """The dataset rows of every trained group, and each step's metrics."""

    def __init__(self, kill_at: int | None = None) -> None:
        self.rows, self.metrics, self.kill_at = [], [], kill_at

    def __call__(self, trainer, rollout, metrics):
        prompts = {tuple(trainer.prompts.encode(r["prompt"])): i for i, r in enumerate(trainer.train_rows)}
        self.rows += [prompts[tuple(p)] for p in rollout.prompt_ids[:: trainer.config.rollout.num_generations]]
        self.metrics.append(metrics)
        if trainer.step == self.kill_at:
            raise KeyboardInterrupt  # the trainer dies mid-run; its checkpoint of step kill_at is on disk


def _run(trainer):
    try:
        trainer.train()
    finally:
        trainer.close()


@pytest.mark.parametrize("engines", [1, 2])
def test_async_steps_train_whole_groups_within_the_staleness_bound(tmp_path, engines):
    """With one engine process or two sharing the prompts: whole groups, each row once, within the bound."""
    ledger = _Ledger()
    trainer = _trainer(tmp_path, f"rollout.async_engine.engines={engines}", callbacks=[ledger])
    _run(trainer)
    _check_whole_groups(trainer, ledger)
    if engines == 2:
        assert all(sum(m.get(f"rollout/groups_engine_{k}", 0) for m in ledger.metrics) > 0 for k in (0, 1))


def _check_whole_groups(trainer, ledger) -> None:
    assert trainer.step == STEPS and not trainer.rollout.remote
    counts = ("started", "restarted", "dropped", "dropped_stale", "generated_tokens", "busy_seconds", "idle_seconds")
    for m in ledger.metrics:
        assert m["rollout/trained_samples"] == 2 * 3
        assert m["rollout/staleness_max"] <= MAX_STALENESS
        assert all(f"rollout/{name}" in m for name in counts), sorted(m)  # every step, 0 included: series without gaps
    assert max(m["rollout/staleness_max"] for m in ledger.metrics) >= 1, "generation must overlap training"
    assert len(ledger.rows) == len(set(ledger.rows)) == STEPS * 2


def test_async_dynamic_sampling_trains_groups_with_a_signal(tmp_path):
    """grpo.dynamic_sampling in async mode: the groups whose rewards are all equal are replaced by groups from
    extra prompts sent to the engine, so no trained group of an even operand remains (the rounds suffice here),
    and each group is still trained once."""
    ledger = _Ledger()
    overrides = ["grpo.dynamic_sampling=true", "grpo.max_resample_rounds=8"]
    trainer = _trainer(tmp_path, *overrides, callbacks=[ledger], rewards=(flat_on_even_operands,))
    _run(trainer)
    _check_whole_groups(trainer, ledger)
    assert sum(m["resample_rounds"] for m in ledger.metrics) >= 1
    assert sum(m["frac_zero_var_groups"] for m in ledger.metrics) > 0
    assert not any(even_operand(trainer.train_rows[row]["prompt"]) for row in ledger.rows)


def test_the_next_steps_groups_are_scored_while_this_step_trains(tmp_path):
    """The groups waiting when a step's batch is complete are taken for the next step, and their scoring in the
    reward pool (0.1 s a completion) runs while this step trains: those steps wait for the pool less than it
    worked. Each group is scored at the step that trains it (the trainer_state it is given)."""
    ledger, steps = _Ledger(), []
    overrides = ["reward.workers=1", "health.preflight=false", "rollout.max_staleness=4", "rollout.stale=restart"]
    overrides += ["rollout.partial.groups_in_flight=3"]
    trainer = _trainer(tmp_path, *overrides, callbacks=[ledger], rewards=(char_code_reward, global_step_slowly))
    trainer.callbacks.append(lambda t, rollout, m: steps.append((rollout.version, rollout.generated_rewards_per_func)))
    _run(trainer)
    assert [m["rollout/trained_samples"] for m in ledger.metrics] == [2 * 3] * STEPS
    assert len(ledger.rows) == len(set(ledger.rows)) == STEPS * 2
    for version, per_func in steps:
        assert per_func[:, 1].eq(version).all(), f"step {version} trained groups scored at another step"
    ahead = [m for m in ledger.metrics if m.get("rollout/scored_ahead", 0) > 0]
    assert ahead, "no group was scored ahead"
    waited, worked = sum(m["time/score"] for m in ahead), sum(m["time/score_pool"] for m in ahead)
    assert waited < worked, (waited, worked)  # part of the pool's work hidden behind training, on a loaded host too


@pytest.mark.slow  # ~20 s; the engine started apart is in CI through tests/rollout/test_async_rollouts.py
def test_async_training_with_the_engine_started_apart(tmp_path, monkeypatch):
    """launch external at a fixed address, the link's secret in $GRPO_FAST_LINK_SECRET on both sides: the engine
    process is `grpo-fast engine --connect`, started before the trainer listens (it waits for it), and it exits
    cleanly when the run ends."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("GRPO_FAST_LINK_SECRET", secrets.token_hex(32))
    command = [sys.executable, "-m", "grpo_fast.cli", "engine", "--connect", address, "--connect-seconds", "120"]
    engine = subprocess.Popen(command)
    try:
        ledger = _Ledger()
        launch = ["rollout.async_engine.launch=external", f"rollout.async_engine.address={address}"]
        trainer = _trainer(tmp_path, *launch, callbacks=[ledger])
        _run(trainer)
        _check_whole_groups(trainer, ledger)
        assert engine.wait(timeout=60) == 0
    finally:
        engine.kill()


def test_a_killed_async_run_resumes_without_training_a_group_twice(tmp_path):
    killed = _Ledger(kill_at=2)
    with pytest.raises(KeyboardInterrupt):
        _run(_trainer(tmp_path, callbacks=[killed]))
    resumed = _Ledger()
    trainer = _trainer(tmp_path, "run.resume=true", callbacks=[resumed])
    _run(trainer)
    assert trainer.step == STEPS
    trained = killed.rows[: 2 * 2] + resumed.rows  # the killed run's step 2 was never checkpointed
    assert len(trained) == STEPS * 2
    assert len(set(trained)) == len(trained), "a group was trained twice"

"""The trainer's scoring: TRL's reward arguments, the reward pool's isolation, in-process functions, and where a
function without a fixed place runs: in the pool until the workers have measured it, then in-process when cheap."""

from __future__ import annotations

import logging
import os
import threading

import pytest
import torch
from scoring_verifiers import (
    chat_shaped,
    column_value,
    completion_length,
    global_step,
    logs_a_metric,
    misbehaving,
    slow_length,
)

from grpo_fast.rewards import overlong_penalty
from grpo_fast.rewards.outcomes import InfrastructureError
from grpo_fast.rewards.reward_set import RewardSet, ScoredBatch, TrainerState

STATE = TrainerState(global_step=7, max_steps=10)


@pytest.fixture(scope="module")
def pooled():
    rewards = RewardSet([completion_length, global_step, chat_shaped, column_value], workers=2, timeout=30)
    yield rewards
    rewards.close()


def _score(rewards, rows, texts, ids=None):
    ids = ids if ids is not None else [[1] * (i + 1) for i in range(len(texts))]
    return rewards.submit(rows, texts, ids, STATE).result()


def test_reward_functions_get_what_trl_passes(pooled):
    rows = [{"prompt": "p", "difficulty": 3}, {"prompt": [{"role": "user", "content": "p"}], "difficulty": 5}]
    assert pooled.in_process == [False] * 4 and pooled.placed == [False] * 4  # the first batch goes to the workers
    scored = _score(pooled, rows, ["a", "b"], ids=[[1, 2, 3], [4]])
    torch.testing.assert_close(scored.per_func, torch.tensor([[3.0, 7.0, 0.0, 3.0], [1.0, 7.0, 1.0, 5.0]]))
    assert scored.failures == {} and scored.seconds_pool > 0


def test_cheap_functions_move_in_process_after_one_pooled_batch(caplog):
    """Measured in the workers on the first batch: the cheap function moves in-process (logged), the one that sleeps
    5 ms per completion stays in the pool, and so does a cheap one whose spec says in_process: false."""
    specs = [completion_length, slow_length, {"name": "exact_match", "in_process": False}]
    rewards = RewardSet(specs, workers=2)
    rows = [{"prompt": "p", "answer": "x"}] * 4
    try:
        with caplog.at_level(logging.INFO, logger="grpo_fast.rewards.reward_set"):
            first = _score(rewards, rows, ["x"] * 4)
            assert rewards.in_process == [True, False, False] and rewards.placed == [True, True, True]
            second = _score(rewards, rows, ["x"] * 4)
    finally:
        rewards.close()
    assert "reward completion_length" in caplog.text and "scored in-process from now on" in caplog.text
    assert "slow_length" not in caplog.text
    torch.testing.assert_close(first.per_func, second.per_func)
    torch.testing.assert_close(second.per_func[:, 0], torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_in_process_option_and_unpicklable_functions_run_here():
    caller = []

    def thread_name(prompts, completions, **_):  # a closure: cannot go to a worker
        caller.append(threading.current_thread().name)
        return [1.0] * len(completions)

    rewards = RewardSet([thread_name, {"name": "exact_match", "in_process": True}], workers=2)
    scored = _score(rewards, [{"prompt": "p", "answer": "x"}], ["x"])
    assert rewards.in_process == [True, True] and rewards._pool is None  # no worker was started
    assert caller == [threading.current_thread().name]
    torch.testing.assert_close(scored.per_func, torch.tensor([[1.0, 1.0]]))


def test_a_failing_verifier_costs_one_reward_each_and_is_counted():
    rewards = RewardSet([misbehaving, completion_length], workers=2, timeout=3)
    try:
        texts = ["ok", "hang", "crash", "raise", "ok"]
        scored = _score(rewards, [{"prompt": "p"}] * 5, texts)
    finally:
        rewards.close()
    first = scored.per_func[:, 0].tolist()
    assert first == [1.0, 0.0, 0.0, 0.0, 1.0]  # a hang, a crash, a raise: the lowest reward, never a skip
    torch.testing.assert_close(scored.per_func[:, 1], torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert scored.failures == {"misbehaving/failures": 3, "misbehaving/program_failures": 3}


@pytest.mark.parametrize("failure_reward", [None, -1.0])
def test_a_completion_that_makes_an_in_process_verifier_raise_costs_its_reward_alone_as_in_the_pool(failure_reward):
    """A completion nested past the recursion limit, and one that is not JSON, raise in the verifier: in-process,
    each costs only its own reward (the function's lowest, or reward.failure_reward), counted as the pool counts it;
    the other completions and functions are scored as usual, and both places give the same scores and counts."""
    texts = ["[1]", "[" * 100_000, '{"a": [2]}', "not json", "[[[3]]]"]
    rows = [{"prompt": "p"}] * len(texts)
    scored = {}
    for place in (False, True):
        specs = [{"name": "scoring_verifiers:nesting_depth", "in_process": place}, completion_length]
        rewards = RewardSet(specs, workers=1, failure_reward=failure_reward)
        try:
            scored[place] = _score(rewards, rows, texts)
        finally:
            rewards.close()
        assert rewards.in_process[0] is place
    low = 0.0 if failure_reward is None else failure_reward
    expected = torch.tensor([[2.0, 1.0], [low, 2.0], [3.0, 3.0], [low, 4.0], [4.0, 5.0]])
    for place in (False, True):
        torch.testing.assert_close(scored[place].per_func, expected)
        assert scored[place].failures == {"nesting_depth/failures": 2, "nesting_depth/program_failures": 2}


def test_an_infrastructure_error_in_process_stays_loud():
    def service(prompts, completions, **_):  # a closure: scored in-process
        if "down" in completions:
            raise InfrastructureError("the judge service is down")
        return [1.0] * len(completions)

    rewards = RewardSet([service], workers=2)
    assert _score(rewards, [{"prompt": "p"}], ["up"]).per_func.tolist() == [[1.0]]
    with pytest.raises(InfrastructureError, match="judge service is down"):
        _score(rewards, [{"prompt": "p"}] * 2, ["up", "down"])


def test_without_workers_a_raising_completion_costs_its_reward_alone():
    def picky(prompts, completions, **_):  # a closure: scored in-process
        return [1.0 / (len(c) - 3) for c in completions]  # ZeroDivisionError on a 3-character completion

    rewards = RewardSet([picky], workers=0)
    scored = _score(rewards, [{"prompt": "p"}] * 3, ["abcd", "abc", "abcde"])
    assert scored.per_func.tolist() == [[1.0], [0.0], [0.5]] and rewards._pool is None
    assert scored.failures == {"picky/failures": 1, "picky/program_failures": 1}


def test_a_function_that_raises_on_every_completion_is_named_not_scored_zero():
    """The bug is the function's (here a keyword it does not get): scoring the batch 0 would train on nothing."""

    def needs_a_helper(prompts, completions, helper=None, **_):  # a closure: scored in-process
        return [helper(c) for c in completions]

    rewards = RewardSet([needs_a_helper], workers=2)
    with pytest.raises(RuntimeError, match=r"reward needs_a_helper raised on each of the batch's 3 completions"):
        _score(rewards, [{"prompt": "p"}] * 3, ["a", "b", "c"])


def test_trls_log_metric_and_log_extra_reach_the_scored_batch():
    """TRL 1.16 passes reward functions `log_metric` and `log_extra`; a function that takes them is scored in the
    trainer's process, and what a call that raised had logged is forgotten when its completions are scored alone."""

    def logging_reward(completions, log_metric, log_extra, **_):  # a closure: scored in-process
        lengths = [float(len(c)) for c in completions]
        log_metric("longest", max(lengths))
        log_extra("length", lengths)
        if "boom" in completions and len(completions) > 1:
            raise ValueError("scored alone")
        return lengths

    rewards = RewardSet([logging_reward, {"name": "exact_match", "in_process": True}], workers=2)
    texts = ["ab", "boom", "abcd"]
    scored = _score(rewards, [{"prompt": "p", "answer": "ab"}] * 3, texts)
    assert rewards.in_process == [True, True] and rewards._pool is None
    assert scored.logged_metrics == {"longest": [2.0, 4.0, 4.0]}  # one call per completion after the raise
    assert scored.extra == {"length": [2.0, 4.0, 4.0]}
    both = ScoredBatch.concat([scored, ScoredBatch(torch.zeros(1, 2), {}, 0.0, 0.0, [0.0, 0.0])])  # logged nothing
    assert both.extra == {"length": [2.0, 4.0, 4.0, None]} and both.logged_metrics == scored.logged_metrics
    assert RewardSet([logs_a_metric], workers=2).in_process == [True]  # importable, so poolable but for log_metric


def test_length_rewards_need_no_glue():
    """overlong_penalty by name with only its buffer: the trainer's token ids and max_completion_length."""
    rewards = RewardSet([{"name": "overlong_penalty", "overlong_buffer": 4}], workers=0, max_completion_length=8)
    scored = _score(rewards, [{"prompt": "p"}] * 3, ["a", "b", "c"], ids=[[0] * 2, [0] * 6, [0] * 9])
    torch.testing.assert_close(scored.per_func[:, 0], torch.tensor([0.0, -0.5, -1.0]))
    bound = RewardSet([overlong_penalty], workers=0, max_completion_length=8)  # a bare callable too
    with pytest.raises(KeyError, match="overlong_buffer"):
        _score(bound, [{"prompt": "p"}], ["a"])


def test_trainer_counts_verifier_failures_in_its_metrics(tmp_path):
    from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
    from grpo_fast.trainer import GRPOTrainer, load_config

    tok = build_char_tokenizer()
    opts = ["rollout.engine=hf", "rollout.num_generations=2", "rollout.max_completion_length=2"]
    opts += ["run.prompts_per_step=2", "run.max_steps=1", "run.eval_every=0", "run.save_final=false"]
    opts += ["run.plots=false", "run.tensorboard=false", "run.progress=false", f"run.output_dir={tmp_path}"]
    opts += ["reward.timeout=5", "health.preflight=false"]  # the step's batch is the first the pool scores
    trainer = GRPOTrainer(
        build_tiny_model(tok), [misbehaving, completion_length], [{"prompt": "1"}, {"prompt": "2"}],
        config=load_config(None, opts), tokenizer=tok,
    )  # fmt: skip
    try:
        metrics = trainer.train()
    finally:
        trainer.close()
    assert metrics["reward/misbehaving/failures"] == 0.0  # random completions of the tiny model never say "hang"
    assert metrics["reward/completion_length/mean"] > 0
    assert metrics["time/score_pool"] > 0 and metrics["time/score"] >= 0
    assert os.path.exists(tmp_path / "metrics.jsonl")

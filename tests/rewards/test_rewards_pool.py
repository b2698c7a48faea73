"""The reward pool: hanging or crashing verifiers cost one reward each (a wrong answer's, never a skip),
never the batch; infrastructure failures are skipped, counted, and stop the scoring past a bound."""

from __future__ import annotations

import os
import signal
import time

import pytest
from rewards_verifiers import (
    constant,
    hang_on_hang,
    infrastructure_on_down,
    needs_difficulty,
    segfault_on_crash,
    time_left_of_the_item,
)

from grpo_fast.rewards import RewardPool, math_accuracy, score_completions
from grpo_fast.rewards.outcomes import InfrastructureError, ProgramFailure
from grpo_fast.rewards.pool import lowest_reward
from grpo_fast.rewards.registry import reward_from_spec


@pytest.fixture(scope="module")
def pool():
    with RewardPool(workers=2, timeout=2.0) as p:
        yield p


def test_hanging_verifier_costs_one_reward(pool):
    completions = ["a", "hang", "b", "c"]
    start = time.monotonic()
    scores = pool.score([hang_on_hang, constant], ["p"] * 4, completions)
    assert time.monotonic() - start < 10
    assert scores.rewards == [[1.0, 0.0, 1.0, 1.0], [1.0] * 4]
    assert isinstance(scores.rewards[0][1], ProgramFailure) and "timeout" in scores.rewards[0][1].reason
    assert scores.program_failures() == [1, 0] and scores.infra_failures() == [0, 0]
    assert [(f.reward, f.index, f.kind, f.cause) for f in scores.failures] == [
        ("hang_on_hang", 1, "timeout", "program")
    ]


def test_crashing_verifier_costs_one_reward(pool):
    completions = ["ok", "crash", "ok", "ok", "abort"]  # a NULL dereference (SIGSEGV) and os.abort (SIGABRT)
    scores = pool.score([segfault_on_crash], ["p"] * 5, completions)
    assert scores.rewards == [[0.5, 0.0, 0.5, 0.5, 0.0]]
    assert [(f.index, f.kind) for f in scores.failures] == [(1, "crash"), (4, "crash")]


def test_raising_verifier_is_reported_and_pool_keeps_working(pool):
    scores = pool.score([segfault_on_crash], ["p"] * 2, ["raise", "ok"])
    assert scores.rewards == [[0.0, 0.5]]
    assert scores.failures[0].kind == "error" and "verifier bug" in scores.failures[0].message
    assert pool.score([constant], ["p"], ["x"]).rewards == [[1.0]]


def test_failure_reward_is_configurable_and_defaults_to_the_lowest_reward():
    scores = score_completions([segfault_on_crash], ["p"], ["crash"], workers=1, failure_reward=-2.0)
    assert scores.rewards == [[-2.0]]
    overlong = {"name": "overlong_penalty", "max_completion_length": 8, "overlong_buffer": 4, "penalty_factor": 3.0}
    specs = ["code_tests", "math_accuracy", overlong, "length_penalty"]
    assert [lowest_reward(reward_from_spec(spec)) for spec in specs] == [0.0, 0.0, -3.0, 0.0]  # unbounded: 0
    assert lowest_reward(segfault_on_crash) == 0.0  # nothing declared


def test_infrastructure_failures_are_skipped_counted_and_stop_the_scoring_past_the_bound():
    with RewardPool(workers=1, timeout=5.0, max_infra_failures=2) as pool:
        scores = pool.score([infrastructure_on_down], ["p"] * 3, ["down", "up", "down"])
        assert scores.rewards == [[None, 1.0, None]]
        assert scores.infra_failures() == [2] and scores.program_failures() == [0]
        assert [(f.index, f.kind, f.cause) for f in scores.failures] == [
            (0, "infrastructure", "infrastructure"),
            (2, "infrastructure", "infrastructure"),
        ]
        with pytest.raises(
            InfrastructureError, match=r"3 infrastructure failures .*max_infra_failures=2.*service down"
        ):
            pool.score([infrastructure_on_down], ["p"], ["down"])


def test_a_verifier_in_the_pool_knows_the_time_it_has_left(pool):
    left = pool.score([time_left_of_the_item], ["p"], ["x"]).rewards[0][0]
    assert 0.5 < left <= 2.0 - 1.0  # the pool's 2 s, less a margin of at least 1 s


def test_columns_reach_functions_by_name(pool):
    scores = pool.score(
        [needs_difficulty, math_accuracy],
        ["p"] * 2,
        ["\\boxed{3}", "\\boxed{4}"],
        {"difficulty": [1, 2], "answer": ["3", "5"]},
    )
    assert scores.rewards == [[1.0, 2.0], [1.0, 0.0]]


def test_missing_column_names_it(pool):
    with pytest.raises(KeyError, match="difficulty"):
        pool.score([needs_difficulty], ["p"], ["x"], {"answer": ["1"]})


def test_column_length_mismatch_names_it(pool):
    with pytest.raises(ValueError, match="answer"):
        pool.score([math_accuracy], ["p"] * 2, ["x", "y"], {"answer": ["1"]})


def test_loading_the_functions_does_not_count_against_the_timeout():
    """Unpickling a verifier imports its module (3 s here); the 2 s per-completion clock starts after."""
    from slow_import_verifier import slow_to_load

    with RewardPool(workers=1, timeout=2.0) as pool:
        scores = pool.score([slow_to_load], ["p"] * 2, ["a", "b"])
    assert scores.rewards == [[1.0, 1.0]] and not scores.failures


def test_a_worker_killed_while_idle_is_replaced_at_no_cost():
    """The OOM killer (or a hostile process outside the sandbox) kills an idle worker between two batches:
    the next batch is scored in full, with no failure."""
    with RewardPool(workers=2, timeout=5.0) as p:
        assert p.score([constant], ["p"] * 4, list("abcd")).rewards == [[1.0] * 4]
        for w in p._workers:
            os.kill(w.proc.pid, signal.SIGKILL)
            w.proc.join()
        scores = p.score([constant], ["p"] * 4, list("abcd"))
        assert scores.rewards == [[1.0] * 4] and scores.failures == []


def test_a_worker_killed_while_starting_is_replaced():
    with RewardPool(workers=1, timeout=5.0) as p:
        os.kill(p._workers[0].proc.pid, signal.SIGKILL)
        scores = p.score([constant], ["p"] * 2, ["a", "b"])
        assert scores.rewards == [[1.0, 1.0]] and scores.failures == []

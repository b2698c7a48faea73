"""Reward functions by name, with options, as a YAML run names them; every built-in is reachable."""

from __future__ import annotations

import functools
import pickle
import re

import pytest

import grpo_fast.rewards as rewards
from grpo_fast.rewards import RewardPool
from grpo_fast.rewards.registry import REWARD_FUNCTIONS, reward, reward_from_spec
from grpo_fast.rewards.self_test import Sample, info_of


def test_every_builtin_reward_of_the_package_is_available_by_name():
    exported = {name for name in rewards.__all__ if name in REWARD_FUNCTIONS}
    verifiers = {"math_accuracy", "code_tests", "think_format", "overlong_penalty", "length_penalty"}
    verifiers |= {"json_schema", "sql_execution", "language_consistency"}
    assert verifiers <= exported
    for name in REWARD_FUNCTIONS.names():
        fn = reward_from_spec(name)
        assert callable(fn)
        if name in rewards.__all__:
            assert fn is getattr(rewards, name)


def test_options_bind_and_the_result_runs_in_the_pool():
    spec = {"name": "overlong_penalty", "max_completion_length": 10, "overlong_buffer": 5}
    fn = reward_from_spec(spec)
    assert isinstance(fn, functools.partial)
    assert fn(["p"] * 3, ["x"] * 3, completion_lengths=[4, 8, 12]) == [0.0, -0.6, -1.0]
    pickle.dumps(fn)  # workers receive it pickled
    with RewardPool(workers=1, timeout=30) as pool:
        scores = pool.score([fn], ["p"] * 2, ["a" * 5, "a" * 10])
    assert scores.rewards == [[0.0, -1.0]]


def test_bad_specs_are_errors_that_name_the_problem():
    with pytest.raises(ValueError, match="reward function: unknown name 'nope'"):
        reward_from_spec("nope")
    with pytest.raises(ValueError, match=r"'think_format': unknown option\(s\) \['colour'\]"):
        reward_from_spec({"name": "think_format", "colour": "red"})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['completions'\]; its options: \[[^]]*\]$") as refused:
        reward_from_spec({"name": "overlong_penalty", "completions": 5})  # what the trainer passes at each call
    options = set(re.findall(r"'(\w+)'", str(refused.value).split("its options:")[1]))
    assert "overlong_buffer" in options and options.isdisjoint({"completions", "completion_ids", "prompts"})
    with pytest.raises(ValueError, match="expected a callable, a name"):
        reward_from_spec(3)
    with pytest.raises(ValueError, match="cannot load"):
        reward_from_spec("grpo_fast.rewards:no_such_function")


def test_plug_in_rewards_by_registration_or_import_path():
    def shouting(prompts, completions, **_):
        return [float(c.isupper()) for c in completions]

    REWARD_FUNCTIONS.register("shouting_test_only", shouting)
    assert reward_from_spec("shouting_test_only")(["p"], ["HI"]) == [1.0]
    assert reward_from_spec("grpo_fast.rewards.tasks:exact_match_reward")(["p"], ["4"], answer=["4"]) == [1.0]


def test_code_tests_takes_its_sandbox_limits_from_a_config_mapping():
    fn = reward_from_spec({"name": "code_tests", "limits": {"wall_s": 0.5}})
    slow = "import time\ntime.sleep(5)\ndef f(x):\n    return x\n"
    assert fn(["p"], [slow], tests=[["assert f(1) == 1"]]) == [0.0]  # killed at 0.5 s
    assert fn(["p"], ["def f(x):\n    return x\n"], tests=[["assert f(1) == 1"]]) == [1.0]


def test_a_declaration_travels_with_the_function_not_its_name():
    """A user function named like a built-in inherits nothing of the built-in's self-test (the launch checklist
    then warns that it has no samples); `@reward` declares and registers, once per name."""

    def math_accuracy(prompts, completions, **_):  # same __name__ as the built-in
        return [1.0] * len(completions)

    assert info_of(math_accuracy) == (None, {})
    builtin, options = info_of(reward_from_spec({"name": "math_accuracy", "timeout_s": 2}))
    assert builtin.kind == "accuracy" and len(builtin.samples) >= 5 and options == {"timeout_s": 2}

    samples = [Sample("upper", "HI", {}, True), Sample("lower", "hi", {}, False)]

    @reward("shouting_declared_test_only", kind="format", range=(0.0, 1.0), samples=samples)
    def shouting(prompts, completions, **_):
        return [float(c.isupper()) for c in completions]

    assert reward_from_spec("shouting_declared_test_only") is shouting
    info, _ = info_of(shouting)
    assert info.samples == tuple(samples) and info.reward_range({}) == (0.0, 1.0)
    with pytest.raises(ValueError, match="'shouting_declared_test_only' is already registered"):
        reward("shouting_declared_test_only", kind="format", range=(0.0, 1.0))(math_accuracy)
    with pytest.raises(ValueError, match="'math_accuracy' is already registered"):
        reward("math_accuracy", kind="accuracy", range=(0.0, 1.0))(math_accuracy)

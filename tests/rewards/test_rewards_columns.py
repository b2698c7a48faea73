"""Calling reward functions with dataset columns by name; completions as strings or chat messages."""

from __future__ import annotations

import functools

import pytest
from rewards_verifiers import needs_difficulty

from grpo_fast.rewards import call_reward, completion_text, math_accuracy, overlong_penalty, required_columns


def test_required_columns():
    assert required_columns(math_accuracy) == ["answer"]
    assert required_columns(needs_difficulty) == ["difficulty"]
    bound = functools.partial(overlong_penalty, max_completion_length=10, overlong_buffer=5)
    assert required_columns(bound) == []


def test_call_reward_passes_named_columns():
    rewards = call_reward(math_accuracy, ["p", "p"], ["\\boxed{2}", "\\boxed{3}"], {"answer": ["2", "2"], "x": [0, 0]})
    assert rewards == [1.0, 0.0]


def test_call_reward_calls_as_trl_does_by_keyword():
    def reward_len(completions, **kwargs):  # TRL's quickstart reward: no prompts parameter
        assert kwargs["prompts"] == ["p"] and kwargs["answer"] == ["2"]
        return [-abs(3 - len(c)) for c in completions]

    assert call_reward(reward_len, ["p"], ["abcde"], {"answer": ["2"]}) == [-2.0]


def test_call_reward_missing_column_raises_naming_it():
    with pytest.raises(KeyError, match=r"math_accuracy.*\['answer'\]"):
        call_reward(math_accuracy, ["p"], ["\\boxed{2}"], {"solution": ["2"]})


def test_call_reward_checks_result_length():
    with pytest.raises(ValueError, match="returned 1 rewards for 2"):
        call_reward(lambda prompts, completions: [1.0], ["p", "p"], ["a", "b"], {})


def test_chat_message_completions():
    messages = [{"role": "assistant", "content": "\\boxed{7}"}]
    assert completion_text(messages) == "\\boxed{7}"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "\\boxed{"}, {"type": "text", "text": "7}"}]}]
    assert completion_text(parts) == "\\boxed{7}"
    assert math_accuracy(["p", "p"], [messages, parts], ["7", "7"]) == [1.0, 1.0]
    with pytest.raises(TypeError, match="completion"):
        completion_text(42)

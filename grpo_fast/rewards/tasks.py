"""The rewards of the built-in synthetic tasks (grpo_fast.data.tasks): exact answers and countdown expressions."""

from __future__ import annotations

from collections import Counter

from grpo_fast.data.tasks import arithmetic_value, integer_literals
from grpo_fast.rewards.registry import reward
from grpo_fast.rewards.self_test import Sample
from grpo_fast.rewards.text import completion_text


@reward(
    "exact_match",
    kind="accuracy",
    range=(0.0, 1.0),
    samples=(Sample("right", "4", {"answer": "4"}, True), Sample("wrong", "5", {"answer": "4"}, False)),
)
def exact_match_reward(prompts, completions, answer, **_) -> list[float]:
    """1.0 when the stripped completion equals the answer, else 0.0."""
    return [float(completion_text(c).strip() == str(a).strip()) for c, a in zip(completions, answer, strict=True)]


@reward(
    "countdown",
    kind="accuracy",
    range=(0.0, 1.0),
    samples=(
        Sample("every number once", "1+2+3", {"numbers": [1, 2, 3], "target": 6}, True),
        Sample("a number missing", "3+3", {"numbers": [1, 2, 3], "target": 6}, False),
        Sample("code instead of arithmetic", "__import__('os')", {"numbers": [1, 2, 3], "target": 6}, False),
    ),
)
def countdown_reward(prompts, completions, numbers, target, **_) -> list[float]:
    """1.0 when the completion is an arithmetic expression (+ - * and parentheses, at most
    grpo_fast.data.tasks.MAX_EXPRESSION_CHARS characters) that uses exactly the given numbers, each once, and
    evaluates to the target; else 0.0."""
    out = []
    for c, nums, tgt in zip(completions, numbers, target, strict=True):
        expr = completion_text(c).strip()
        used = integer_literals(expr)
        ok = used is not None and Counter(used) == Counter(int(x) for x in nums)
        out.append(float(ok and arithmetic_value(expr) == int(tgt)))
    return out


def environment_reward(completions, environment_reward, **_) -> list[float | None]:
    """The score each rollout's environment gave it (its get_reward(), the `environment_reward` column of multi-turn
    rollouts; None where it has none). The trainer adds it, with weight 1, to a run whose environments define
    get_reward, as TRL adds them; it is no verifier of its own (no self-test, no declared range)."""
    return list(environment_reward)

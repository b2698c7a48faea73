"""What a run can check about its reward functions before it starts: known-good and known-bad samples
(the verifier self-test), the range of rewards each can give, and whether it pays for correctness or
for form.

Every built-in verifier ships its samples here, adversarial ones included (many answers listed, the
answer outside its slot, forged test output), because a verifier that pays a bad sample as much as a
good one will be learned by the policy. A function of your own declares the same with
`describe(fn, kind=..., reward_range=..., samples=[...])`, or by setting `fn.reward_info`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo_fast.rewards.columns import RewardFunc
from grpo_fast.rewards.routing import unrouted

KINDS = ("accuracy", "format", "length", "other")


@dataclass(frozen=True)
class Sample:
    """One self-test case: a completion, the dataset columns of its row, and whether a correct verifier
    must score it above every `good=False` sample of the same function."""

    name: str
    completion: str
    columns: Mapping[str, Any]
    good: bool


@dataclass(frozen=True)
class RewardInfo:
    """kind: "accuracy" (pays for a correct answer), "format", "length" or "other". reward_range: the
    lowest and highest reward, given the function's bound options (±inf when unbounded)."""

    kind: str
    reward_range: Callable[[Mapping[str, Any]], tuple[float, float]]
    samples: tuple[Sample, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")


def describe(
    fn: RewardFunc, *, kind: str, reward_range: tuple[float, float], samples: list[Sample] | tuple = ()
) -> RewardFunc:
    """Attach a RewardInfo to your own reward function (returns it, so it works as a decorator helper)."""
    fn.reward_info = RewardInfo(kind, lambda _: reward_range, tuple(samples))
    return fn


def info_of(fn: RewardFunc) -> tuple[RewardInfo | None, dict[str, Any]]:
    """(RewardInfo of `fn` or of the function a functools.partial wraps, the partial's bound options); a
    routed function (a spec's `when`) is described by the function it routes."""
    fn = unrouted(fn)
    options = dict(getattr(fn, "keywords", None) or {})
    inner = getattr(fn, "func", fn)
    info = getattr(inner, "reward_info", None) or BUILTIN_INFO.get(getattr(inner, "__name__", ""))
    return info, options


def _fixed(low: float, high: float):
    return lambda _: (low, high)


_ADD_TESTS = ["assert f(1) == 2", "assert f(5) == 6", "assert f(-3) == -2"]
_FORGED_ANSWERS = (
    "import os\ndef f(x):\n    return 0\nfor fd in range(3, 1024):\n    try:\n"
    '        os.write(fd, b\'{"loaded": true}\\n\' + b\'{"ok": true, "value": "True"}\\n\' * 64)\n'
    "    except OSError:\n        pass\n"
)
_PEOPLE = "CREATE TABLE people (name TEXT, age INTEGER); INSERT INTO people VALUES ('ann', 31), ('bob', 25);"
_SQL = {"db": _PEOPLE, "reference_sql": "SELECT name FROM people WHERE age > 30"}
_HUGE = list(range(1_000_000))  # far past any completion budget

BUILTIN_INFO: dict[str, RewardInfo] = {
    "math_accuracy": RewardInfo(
        "accuracy",
        _fixed(0.0, 1.0),
        (
            Sample("boxed right answer", "So the answer is $\\boxed{\\frac{1}{2}}$.", {"answer": "0.5"}, True),
            Sample("boxed wrong answer", "So the answer is $\\boxed{\\frac{1}{3}}$.", {"answer": "0.5"}, False),
            Sample(
                "many answers listed", " ".join(f"\\boxed{{{k / 10}}}" for k in range(1, 10)), {"answer": "0.5"}, False
            ),
            Sample("answer outside the slot", "The answer is 0.5, I think.", {"answer": "0.5"}, False),
            Sample("answer inside longer text", "\\boxed{0.5 or maybe 0.7}", {"answer": "0.5"}, False),
        ),
    ),
    "code_tests": RewardInfo(
        "accuracy",
        _fixed(0.0, 1.0),
        (
            Sample("correct program", "```python\ndef f(x):\n    return x + 1\n```", {"tests": _ADD_TESTS}, True),
            Sample("wrong program", "```python\ndef f(x):\n    return x - 1\n```", {"tests": _ADD_TESTS}, False),
            Sample("forged test output", f"```python\n{_FORGED_ANSWERS}```", {"tests": _ADD_TESTS}, False),
        ),
    ),
    "think_format": RewardInfo(
        "format",
        lambda options: (0.0, float(options.get("bonus", 0.2))),
        (
            Sample("think then answer", "<think>2 + 2 is 4.</think> \\boxed{4}", {}, True),
            Sample("no reasoning block", "\\boxed{4}", {}, False),
        ),
    ),
    "overlong_penalty": RewardInfo(
        "length",
        lambda options: (-float(options.get("penalty_factor", 1.0)), 0.0),
        (
            Sample("one token", "x", {"completion_ids": [1]}, True),
            Sample("a million tokens", "x", {"completion_ids": _HUGE}, False),
        ),
    ),
    "length_penalty": RewardInfo(
        "length",
        _fixed(-math.inf, 0.0),
        (
            Sample("one token", "x", {"completion_ids": [1]}, True),
            Sample("a million tokens", "x", {"completion_ids": _HUGE}, False),
        ),
    ),
    "json_schema": RewardInfo(
        "accuracy",
        _fixed(0.0, 1.0),
        (
            Sample("valid object", '{"a": 1}', {"schema": {"type": "object", "required": ["a"]}}, True),
            Sample("missing field", '{"b": 1}', {"schema": {"type": "object", "required": ["a"]}}, False),
            Sample("not JSON", "a = 1", {"schema": {"type": "object", "required": ["a"]}}, False),
        ),
    ),
    "sql_execution": RewardInfo(
        "accuracy",
        _fixed(0.0, 1.0),
        (
            Sample("same result set", "SELECT name FROM people WHERE age >= 31", _SQL, True),
            Sample("other result set", "SELECT name FROM people", _SQL, False),
            Sample("a write", "DELETE FROM people", _SQL, False),
        ),
    ),
    "language_consistency": RewardInfo(
        "format",
        _fixed(0.0, 1.0),
        (
            Sample("one script", "<think>The sum of two and two is four.</think> 4", {"language": "en"}, True),
            Sample("mixed scripts", "<think>两个加两个 is четыре.</think> 4", {"language": "en"}, False),
        ),
    ),
    "exact_match_reward": RewardInfo(
        "accuracy",
        _fixed(0.0, 1.0),
        (Sample("right", "4", {"answer": "4"}, True), Sample("wrong", "5", {"answer": "4"}, False)),
    ),
    "countdown_reward": RewardInfo(
        "accuracy",
        _fixed(0.0, 1.0),
        (
            Sample("every number once", "1+2+3", {"numbers": [1, 2, 3], "target": 6}, True),
            Sample("a number missing", "3+3", {"numbers": [1, 2, 3], "target": 6}, False),
            Sample("code instead of arithmetic", "__import__('os')", {"numbers": [1, 2, 3], "target": 6}, False),
        ),
    ),
    # A learned reward model pays for what its training data preferred, not for a verified answer; no model is
    # bundled, so it ships no samples (preflight says so), and its logits are unbounded (preflight warns).
    "reward_model": RewardInfo("other", _fixed(-math.inf, math.inf)),
}

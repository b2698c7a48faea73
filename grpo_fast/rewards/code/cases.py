"""The `tests` column of code rewards: hidden test cases, and how each becomes a check.

Formats of one row's `tests` (a JSON string of any of these is accepted too):
- Python assert statements: ["assert add(1, 2) == 3", "s = Stack()\\ns.push(1)\\nassert s.pop() == 1"].
  Each string is one test, passed when all its asserts hold; it must end with an assert. Statements
  before an assert are setup; those that use the program's names run in the program's namespace (the
  program is loaded as module `solution`, so its `if __name__ == "__main__":` block does not run).
- stdin/stdout pairs: [{"input": "1 2\\n", "output": "3\\n"}, ...], or {"inputs": [...], "outputs": [...]}
  (APPS / TACO layout). The program reads `input` on stdin; its stdout must equal `output` up to
  trailing whitespace on each line and trailing blank lines.

How an assert test is judged (the expected values never enter the candidate's sandbox): plan.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from grpo_fast.rewards.code.plan import AssertCase, parse_assert


@dataclass(frozen=True)
class IOCase:
    """One stdin/stdout test."""

    input: str
    output: str


def parse_cases(tests: Any) -> list[AssertCase] | list[IOCase]:
    """The row's tests as AssertCases or IOCases (one kind per row). Raises ValueError naming `tests`."""
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except ValueError:
            tests = [tests]
    if isinstance(tests, dict) and {"inputs", "outputs"} <= tests.keys():
        tests = [{"input": i, "output": o} for i, o in zip(tests["inputs"], tests["outputs"], strict=True)]
    if not isinstance(tests, (list, tuple)):
        raise ValueError(f"tests: expected a list of asserts or of input/output dicts, got {type(tests).__name__}")
    if all(isinstance(t, str) for t in tests):
        return [parse_assert(t) for t in tests]
    if all(isinstance(t, dict) and {"input", "output"} <= t.keys() for t in tests):
        return [IOCase(_as_text(t["input"]), _as_text(t["output"])) for t in tests]
    raise ValueError("tests: mix of kinds, or dicts without 'input' and 'output'")


def _as_text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def same_output(got: str, expected: str) -> bool:
    """stdout comparison: equal up to trailing whitespace per line and trailing blank lines."""

    def norm(s: str) -> list[str]:
        return [line.rstrip() for line in s.rstrip().splitlines()]

    return norm(got) == norm(expected)

"""The `tests` column of code rewards: hidden test cases, and how each becomes a check.

Formats of one row's `tests` (a JSON string of any of these is accepted too):
- Python assert statements: ["assert add(1, 2) == 3", "s = Stack()\\ns.push(1)\\nassert s.pop() == 1"].
  Each string is one test: statements before the final `assert` are setup, run in the program's
  namespace (the program is loaded as module `solution`, so its `if __name__ == "__main__":` block
  does not run).
- stdin/stdout pairs: [{"input": "1 2\\n", "output": "3\\n"}, ...], or {"inputs": [...], "outputs": [...]}
  (APPS / TACO layout). The program reads `input` on stdin; its stdout must equal `output` up to
  trailing whitespace on each line and trailing blank lines.

How an assert becomes a check (the expected value never enters the sandbox):
- `assert LHS == RHS` with RHS a Python literal: the sandbox evaluates LHS only and returns its repr;
  the caller compares `ast.literal_eval(repr) == RHS`.
- `assert LHS == RHS` with a non-literal RHS (`sorted([3, 1])`): RHS is first evaluated in a clean
  sandbox without the program; if that fails (it uses the program's names), as below.
- any other assert (`assert is_prime(7)`, `assert abs(f(x) - 1) < 1e-6`): the sandbox evaluates
  `bool(expression)` and the caller requires True. This form is weaker: a program that subverts its
  own interpreter could answer True without computing anything.
Values that `ast.literal_eval` cannot read back (inf, nan, custom objects) fail the test.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AssertCase:
    """One assert test: run `setup`, evaluate `expr` (as bool when `truth`), compare with `expected`.
    `expected_src` is set when RHS needs a clean evaluation first."""

    setup: str
    expr: str
    truth: bool
    expected: Any = True
    expected_src: str | None = None

    def probe(self) -> dict[str, Any]:
        return {"setup": self.setup, "expr": self.expr, "truth": self.truth}


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


def parse_assert(test: str) -> AssertCase:
    """Split one assert test into setup, probed expression and expected value (see module doc)."""
    try:
        body = ast.parse(test).body
    except SyntaxError as exc:
        raise ValueError(f"tests: not valid Python: {test!r:.200} ({exc.msg})") from None
    if not body or not isinstance(body[-1], ast.Assert):
        raise ValueError(f"tests: each test must end with an assert statement: {test!r:.200}")
    setup = "\n".join(ast.unparse(stmt) for stmt in body[:-1])
    cond = body[-1].test
    if isinstance(cond, ast.Compare) and len(cond.ops) == 1 and isinstance(cond.ops[0], ast.Eq):
        lhs, rhs = ast.unparse(cond.left), cond.comparators[0]
        try:
            return AssertCase(setup, lhs, False, ast.literal_eval(rhs))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return AssertCase(setup, lhs, False, None, ast.unparse(rhs))
    return AssertCase(setup, ast.unparse(cond), True)


def read_value(text: Any) -> tuple[bool, Any]:
    """(True, value) when a probe's repr reads back as a literal, else (False, None)."""
    if not isinstance(text, str):
        return False, None
    try:
        return True, ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def same_output(got: str, expected: str) -> bool:
    """stdout comparison: equal up to trailing whitespace per line and trailing blank lines."""

    def norm(s: str) -> list[str]:
        return [line.rstrip() for line in s.rstrip().splitlines()]

    return norm(got) == norm(expected)

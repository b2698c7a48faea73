"""`code_tests`: reward = fraction of hidden tests a completion's program passes in the sandbox.

Program: the last ```python (or ```py / ```python3) fenced block of the completion; else the last
fenced block of any language; else the whole completion when it has no fence at all.
Tests: the `tests` column, formats in `cases.py`. Reward per completion: passed / total in [0, 1];
0.0 when there is no program; None when the row has no tests.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpo_fast.rewards.code.cases import AssertCase, IOCase, parse_cases, read_value, same_output
from grpo_fast.rewards.code.runners import PythonRunner, Runner
from grpo_fast.rewards.code.sandbox import SandboxLimits, run_sandboxed
from grpo_fast.rewards.text import broadcast_column, completion_texts

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3"}
_PROBE_SOURCE = Path(__file__).with_name("probe_runner.py").read_text(encoding="utf-8")


def extract_code(text: str) -> str:
    """The program in a completion (see module doc)."""
    blocks = _FENCE.findall(text)
    python = [code for tag, code in blocks if tag.lower() in _PYTHON_TAGS]
    if python:
        return python[-1]
    if blocks:
        return blocks[-1][1]
    return text if "```" not in text else ""


def code_tests(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    tests: Sequence[Any],
    *,
    limits: SandboxLimits | None = None,
    runner: Runner | None = None,
    python: str = sys.executable,
    **_: Any,
) -> list[float | None]:
    """Fraction of each row's `tests` passed by the completion's program (see module doc).

    limits: sandbox limits (wall-clock per test, memory, ...; default SandboxLimits()). runner: language runner for
    stdin/stdout tests (default Python). python: interpreter for Python programs and assert tests.
    """
    texts = completion_texts(completions)
    rows = broadcast_column("tests", tests, len(texts)) if isinstance(tests, (list, tuple)) else [tests] * len(texts)
    return [
        score_program(
            extract_code(text), parse_cases(row), limits or SandboxLimits(), runner or PythonRunner(python), python
        )
        for text, row in zip(texts, rows, strict=True)
    ]


def score_program(
    program: str, cases: list[AssertCase] | list[IOCase], limits: SandboxLimits, runner: Runner, python: str
) -> float | None:
    """Fraction of `cases` that `program` passes."""
    if not cases:
        return None
    if not program.strip():
        return 0.0
    if isinstance(cases[0], IOCase):
        passed = _run_io(program, cases, limits, runner)
    else:
        passed = _run_asserts(program, _resolve_expected(cases, limits, python), limits, python)
    return sum(passed) / len(cases)


def _run_io(program: str, cases: list[IOCase], limits: SandboxLimits, runner: Runner) -> list[bool]:
    runs = [{"argv": runner.command(), "stdin": case.input} for case in cases]
    results = run_sandboxed(runner.files(program), runs, limits)
    return [
        "error" not in r and r["exit"] == 0 and not r["output_exceeded"] and same_output(r["stdout"], case.output)
        for r, case in zip(results, cases, strict=True)
    ]


def _probe_argv(python: str) -> list[str]:
    return [python, "-I", "-c", _PROBE_SOURCE, "solution.py"]


def _resolve_expected(cases: list[AssertCase], limits: SandboxLimits, python: str) -> list[AssertCase]:
    """Evaluate non-literal right-hand sides in a clean sandbox (no program); a case whose RHS fails
    there becomes a truth check of `LHS == RHS` inside the program's sandbox."""
    pending = [c for c in cases if c.expected_src is not None]
    if not pending:
        return cases
    probes = [{"setup": "", "expr": c.expected_src, "truth": False} for c in pending]
    answers = run_sandboxed({"solution.py": ""}, [{"argv": _probe_argv(python), "probes": probes}], limits, python)[0]
    values = iter(answers.get("probes") or [{}] * len(pending))
    resolved = []
    for case in cases:
        if case.expected_src is None:
            resolved.append(case)
            continue
        answer = next(values)
        ok, value = read_value(answer.get("value")) if answer.get("ok") else (False, None)
        if ok:
            resolved.append(AssertCase(case.setup, case.expr, False, value))
        else:
            resolved.append(AssertCase(case.setup, f"({case.expr}) == ({case.expected_src})", True))
    return resolved


def _run_asserts(program: str, cases: list[AssertCase], limits: SandboxLimits, python: str) -> list[bool]:
    run = {"argv": _probe_argv(python), "probes": [c.probe() for c in cases]}
    result = run_sandboxed({"solution.py": program}, [run], limits, python)[0]
    if "error" in result:
        log.warning("code_tests: %s", result["error"])
        return [False] * len(cases)
    passed = []
    for case, answer in zip(cases, result["probes"], strict=True):
        ok, value = read_value(answer.get("value")) if answer.get("ok") is True else (False, None)
        passed.append(ok and (value is True if case.truth else value == case.expected))
    return passed

"""`code_tests`: reward = fraction of hidden tests a completion's program passes in the sandbox.

Program: the last ```python (or ```py / ```python3) fenced block of the completion; else the last
fenced block of any language; else the whole completion when it has no fence at all.
Tests: the `tests` column, formats in `cases.py`; how an assert test is split between the program's
sandbox, a clean sandbox and the judge in this process: `plan.py`. Reward per completion: passed /
total in [0, 1]; 0.0 when there is no program; None when the row has no tests.

Per call: one clean sandbox run evaluates what the asserts need from their own setup (cached across
calls), then one sandbox per completion runs its program against all of its row's tests.
Programs run only in the "namespaces" sandbox; elsewhere `code_tests` raises unless
`allow_unsandboxed=True` (UNSAFE, see sandbox.py).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_fast.rewards.code.cases import AssertCase, IOCase, parse_cases, same_output
from grpo_fast.rewards.code.plan import Step, resolved_values
from grpo_fast.rewards.code.runners import PythonRunner, Runner
from grpo_fast.rewards.code.sandbox import SandboxLimits, require_isolation, run_sandboxed
from grpo_fast.rewards.registry import reward
from grpo_fast.rewards.self_test import Sample
from grpo_fast.rewards.text import broadcast_column, completion_texts

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3"}
_PROBE_SOURCE = Path(__file__).with_name("probe_runner.py").read_text(encoding="utf-8")
_CLEAN_CACHE_SIZE = 4096


@dataclass(frozen=True)
class _Sandbox:
    """How programs run: limits, stdin/stdout runner, interpreter, and whether without namespaces."""

    limits: SandboxLimits
    runner: Runner
    python: str
    allow_unsandboxed: bool

    def run(self, files: dict[str, str], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return run_sandboxed(files, runs, self.limits, self.python, allow_unsandboxed=self.allow_unsandboxed)

    def probe_run(self, probes: list[dict[str, Any]]) -> dict[str, Any]:
        return {"argv": [self.python, "-I", "-c", _PROBE_SOURCE, "solution.py"], "probes": probes}


def extract_code(text: str) -> str:
    """The program in a completion (see module doc)."""
    blocks = _FENCE.findall(text)
    python = [code for tag, code in blocks if tag.lower() in _PYTHON_TAGS]
    if python:
        return python[-1]
    if blocks:
        return blocks[-1][1]
    return text if "```" not in text else ""


_ADD_TESTS = ["assert f(1) == 2", "assert f(5) == 6", "assert f(-3) == -2"]
_FORGED_ANSWERS = (  # writes fake result lines to every descriptor the program might share with the judge
    "import os\ndef f(x):\n    return 0\nfor fd in range(3, 1024):\n    try:\n"
    '        os.write(fd, b\'{"loaded": true}\\n\' + b\'{"ok": true, "value": "True"}\\n\' * 64)\n'
    "    except OSError:\n        pass\n"
)


@reward(
    "code_tests",
    kind="accuracy",
    range=(0.0, 1.0),
    samples=(
        Sample("correct program", "```python\ndef f(x):\n    return x + 1\n```", {"tests": _ADD_TESTS}, True),
        Sample("wrong program", "```python\ndef f(x):\n    return x - 1\n```", {"tests": _ADD_TESTS}, False),
        Sample("forged test output", f"```python\n{_FORGED_ANSWERS}```", {"tests": _ADD_TESTS}, False),
    ),
)
def code_tests(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    tests: Sequence[Any],
    *,
    limits: SandboxLimits | Mapping[str, Any] | None = None,
    runner: Runner | None = None,
    python: str = sys.executable,
    allow_unsandboxed: bool = False,
    **_: Any,
) -> list[float | None]:
    """Fraction of each row's `tests` passed by the completion's program (see module doc).

    limits: sandbox limits (wall-clock per test, memory, ...; default SandboxLimits(); a mapping of its fields, as a
        YAML config gives them, works too). runner: language runner for
    stdin/stdout tests (default Python). python: interpreter for Python programs and assert tests.
    allow_unsandboxed: run programs even where namespaces are unavailable (UNSAFE; default: raise RuntimeError).
    """
    require_isolation(allow_unsandboxed)
    if isinstance(limits, Mapping):
        limits = SandboxLimits(**limits)
    sandbox = _Sandbox(limits or SandboxLimits(), runner or PythonRunner(python), python, allow_unsandboxed)
    texts = completion_texts(completions)
    rows = broadcast_column("tests", tests, len(texts)) if isinstance(tests, (list, tuple)) else [tests] * len(texts)
    cases = [parse_cases(row) for row in rows]
    resolved = _resolve([case for row in cases for case in row if isinstance(case, AssertCase)], sandbox)
    return [score_program(extract_code(text), row, sandbox, resolved) for text, row in zip(texts, cases, strict=True)]


def score_program(
    program: str,
    cases: list[AssertCase] | list[IOCase],
    sandbox: _Sandbox,
    resolved: dict[tuple[Step, ...], tuple[Any, ...]],
) -> float | None:
    """Fraction of `cases` that `program` passes; `resolved`: what `_resolve` returned for them."""
    if not cases:
        return None
    if not program.strip():
        return 0.0
    if isinstance(cases[0], IOCase):
        passed = _run_io(program, cases, sandbox)
    else:
        passed = _run_asserts(program, cases, sandbox, resolved)
    return sum(passed) / len(cases)


def _run_io(program: str, cases: list[IOCase], sandbox: _Sandbox) -> list[bool]:
    runs = [{"argv": sandbox.runner.command(), "stdin": case.input} for case in cases]
    results = sandbox.run(sandbox.runner.files(program), runs)
    return [
        "error" not in r and r["exit"] == 0 and not r["output_exceeded"] and same_output(r["stdout"], case.output)
        for r, case in zip(results, cases, strict=True)
    ]


def _run_asserts(
    program: str, cases: list[AssertCase], sandbox: _Sandbox, resolved: dict[tuple[Step, ...], tuple[Any, ...]]
) -> list[bool]:
    judged = [case for case in cases if case.problem is None]
    probes = [case.probe() for case in judged]
    result = sandbox.run({"solution.py": program}, [sandbox.probe_run(probes)])[0] if judged else {}
    if "error" in result:
        log.warning("code_tests: %s", result["error"])
        return [False] * len(cases)
    answers = iter(result.get("probes", ()))
    return [
        case.problem is None and case.passes(next(answers).get("answer"), resolved.get(case.clean, ()))
        for case in cases
    ]


_clean_cache: OrderedDict[tuple[str, SandboxLimits, tuple[Step, ...]], tuple[Any, ...]] = OrderedDict()
_clean_lock = threading.Lock()


def _resolve(cases: list[AssertCase], sandbox: _Sandbox) -> dict[tuple[Step, ...], tuple[Any, ...]]:
    """The values of the tests' own sub-expressions (plan.Resolved), by `case.clean`: one clean sandbox
    run (an empty program) for all those not cached. Answers are cached; failed runs (timeouts) are not."""
    wanted = {case.clean: case for case in cases if case.clean and case.problem is None}
    values: dict[tuple[Step, ...], tuple[Any, ...]] = {}
    with _clean_lock:
        for clean in wanted:
            key = (sandbox.python, sandbox.limits, clean)
            if key in _clean_cache:
                _clean_cache.move_to_end(key)
                values[clean] = _clean_cache[key]
    missing = [case for clean, case in wanted.items() if clean not in values]
    if not missing:
        return values
    result = sandbox.run({"solution.py": ""}, [sandbox.probe_run([case.clean_probe() for case in missing])])[0]
    for case, outcome in zip(missing, result.get("probes") or [result] * len(missing), strict=True):
        answer = outcome.get("answer")
        values[case.clean] = resolved_values(case, answer)
        problem = answer.get("error") if answer is not None else outcome.get("error")
        if problem:
            log.warning("code_tests: a test's own code failed in a clean interpreter (%s): %.300r", problem, case.test)
        if answer is not None:
            with _clean_lock:
                _clean_cache[(sandbox.python, sandbox.limits, case.clean)] = values[case.clean]
                while len(_clean_cache) > _CLEAN_CACHE_SIZE:
                    _clean_cache.popitem(last=False)
    return values

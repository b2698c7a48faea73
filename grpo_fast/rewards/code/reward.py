"""`code_tests`: reward = fraction of hidden tests a completion's program passes in the sandbox.

Program: the last ```python (or ```py / ```python3) fenced block of the completion; else the last
fenced block of any language; else the whole completion when it has no fence at all.
Tests: the `tests` column, formats in `cases.py`. Reward per completion: passed / total in [0, 1];
0.0 when there is no program; None when the row has no tests.

How a completion is scored: one sandbox per completion holds its program (isolation.py picks the
backend: namespaces, bwrap or remote). A stdin/stdout test runs the program on its input there. An
assert test runs in the judge (judge_runner.py, a clean interpreter in a sandbox of its own), which
asks the program's sandbox for each call the test makes (call_runner.py): the program gets names and
argument values only, answers plain data, and everything else of the test runs in the judge.

Failures (grpo_fast.rewards.outcomes): whatever the program does (crash, hang, garbage, a judge
broken by its answers, running out of `limits.completion_s` or of the reward pool's time) fails the
tests it hit, and the reward is a `ProgramFailure` (a float: the fraction of tests passed) that
says what happened. Failures the program cannot cause (no sandbox, no interpreter, an unreachable
service) raise InfrastructureError. Before the first completion, the verifier checks itself
(startup.py) and raises VerifierStartupError when a known-correct program fails or a known-wrong
one passes. `code_tests` never raises because of what a program does.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpo_fast.rewards.checks import VerifierStatus
from grpo_fast.rewards.code import programs
from grpo_fast.rewards.code.cases import AssertCase, IOCase, parse_cases, same_output
from grpo_fast.rewards.code.remote import RemoteProgram, RemoteService
from grpo_fast.rewards.code.runners import PythonRunner, Runner
from grpo_fast.rewards.code.startup import check
from grpo_fast.rewards.code.wire import WireError, dumps, loads
from grpo_fast.rewards.outcomes import InfrastructureError, ProgramFailure, VerifierStartupError
from grpo_fast.rewards.pool import time_left
from grpo_fast.rewards.registry import reward
from grpo_fast.rewards.self_test import Sample
from grpo_fast.rewards.text import broadcast_column, completion_texts
from grpo_fast.sandbox import BACKENDS, SandboxConfig, SandboxLimits, choose, containment, isolation

_FENCE = re.compile(r"```([\w+-]*)[^\n`]*\n(.*?)```", re.DOTALL)  # no backtick in the info string (CommonMark)
_PYTHON_TAGS = {"python", "py", "python3"}


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


_DEEP = "def f(x):\n    v = []\n    for _ in range(100000):\n        v = [v]\n    return v\n"
_ALWAYS_EQUAL = "class Y:\n    __eq__ = lambda s, o: True\n    __hash__ = None\n\nf = lambda x: Y()\n"


def _program(source: str) -> str:
    return f"```python\n{source}```"


@reward(
    "code_tests",
    kind="accuracy",
    range=(0.0, 1.0),
    samples=(
        Sample("correct program", _program("def f(x):\n    return x + 1\n"), {"tests": _ADD_TESTS}, True),
        Sample("wrong program", _program("def f(x):\n    return x - 1\n"), {"tests": _ADD_TESTS}, False),
        Sample("forged test output", _program(_FORGED_ANSWERS), {"tests": _ADD_TESTS}, False),
        Sample(
            "expected value read from the test's setup",
            _program("def f(x):\n    return globals().get('y', 0)\n"),
            {"tests": ["x, y = 1, 2\nassert f(x) == y"]},
            False,
        ),
        Sample(
            "an object equal to everything", _program(_ALWAYS_EQUAL), {"tests": ["ok = f(1) == 2\nassert ok"]}, False
        ),
        Sample(
            "exits before the tests",
            _program("import os\n\ndef f(x):\n    os._exit(0)\n"),
            {"tests": _ADD_TESTS},
            False,
        ),
        Sample("an answer too deep to read", _program(_DEEP), {"tests": ["assert f(1) == [[]]"]}, False),
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
    sandbox: SandboxConfig | Mapping[str, Any] | str | None = None,
    allow_unsandboxed: bool = False,
    **_: Any,
) -> list[float | None]:
    """Fraction of each row's `tests` passed by the completion's program (see module doc).

    limits: SandboxLimits, or a mapping of its fields as a YAML config gives them. runner: language
    runner for stdin/stdout tests (default Python). python: interpreter for Python programs, the call
    runner and the judge. sandbox: the backend (isolation.SandboxConfig, a mapping of its fields, or a
    backend name; default "auto", the strongest available). allow_unsandboxed: run programs where no
    sandbox is available (UNSAFE, trusted programs only; default: raise RuntimeError).
    """
    from grpo_fast.rewards.code.startup import check

    scorer = Scorer.of(limits, runner, python, sandbox, allow_unsandboxed)
    texts = completion_texts(completions)
    rows = broadcast_column("tests", tests, len(texts)) if isinstance(tests, (list, tuple)) else [tests] * len(texts)
    cases = [parse_cases(row) for row in rows]
    check(scorer, {"io" if isinstance(row[0], IOCase) else "assert" for row in cases if row})
    return [scorer.score(extract_code(text), row) for text, row in zip(texts, cases, strict=True)]


def _startup_check(
    *,
    limits: SandboxLimits | Mapping[str, Any] | None = None,
    runner: Runner | None = None,
    python: str = sys.executable,
    sandbox: SandboxConfig | Mapping[str, Any] | str | None = None,
    allow_unsandboxed: bool = False,
    **_: Any,
) -> VerifierStatus:
    """code_tests' start-up check with these options (grpo_fast.rewards.checks): its sandbox backend runs a
    known-correct and a known-wrong program on assert and stdin/stdout tests. Names the backend (also as the
    metric sandbox/<backend>); raises VerifierStartupError."""
    try:
        scorer = Scorer.of(limits, runner, python, sandbox, allow_unsandboxed)
    except InfrastructureError as exc:
        raise VerifierStartupError(f"code_tests start-up check: {exc}") from exc
    check(scorer, {"assert", "io"})
    if scorer.backend not in BACKENDS:
        bounds, whole = "UNSAFE: programs run without a sandbox (allow_unsandboxed)", False
    else:
        bounds, whole = containment(scorer.backend, scorer.config)
        bounds += "" if whole else ", allowed by sandbox.allow_per_process_memory"
    text = f"sandbox backend {scorer.backend}, {bounds}; start-up check passed"
    metrics = {f"sandbox/{scorer.backend}": 1.0, "sandbox/memory_per_sandbox": float(whole)}
    return VerifierStatus(text, metrics, unsafe=not whole)


code_tests.startup_check = _startup_check
code_tests.release = programs.close_idle  # judges and sandboxes set up ahead in this process


@dataclass(frozen=True)
class Scorer:
    """How programs are scored: the backend, its settings, and the judge's backend."""

    backend: str
    config: SandboxConfig
    limits: SandboxLimits
    runner: Runner
    python: str

    @classmethod
    def of(cls, limits, runner, python, sandbox, allow_unsandboxed) -> Scorer:
        config = SandboxConfig.of(sandbox)
        backend = choose(config, allow_unsandboxed)
        return cls(backend, config, SandboxLimits.of(limits), runner or PythonRunner(python), python)

    @property
    def judge_level(self) -> str:
        """The judge runs locally: in the programs' backend, or (remote) the strongest local one."""
        return isolation() if self.backend == "remote" else self.backend

    def score(self, program: str, cases: list[AssertCase] | list[IOCase]) -> float | None:
        """Fraction of `cases` that `program` passes (a ProgramFailure where it failed some itself)."""
        if not cases:
            return None
        if not program.strip():
            return 0.0
        left = time_left()
        deadline = time.monotonic() + min(self.limits.completion_s, left if left is not None else float("inf"))
        failures: list[str] = []
        side = self.program(program, cases)
        try:
            if isinstance(cases[0], IOCase):
                passed = [self._io(side, case, deadline, failures) for case in cases]
            else:
                passed = _AssertRun(self, side, deadline, failures).run(cases)
        finally:
            side.close()
        score = sum(passed) / len(cases)
        return ProgramFailure(score, "; ".join(dict.fromkeys(failures))[:1000]) if failures else score

    def program(self, program: str, cases: list) -> programs.LocalProgram | RemoteProgram:
        """The program's side: a local sandbox, or the remote service."""
        files = self.runner.files(program) if isinstance(cases[0], IOCase) else {"solution.py": program}
        if self.backend == "remote":
            service = RemoteService(self.config, 8 * self.limits.output_bytes + (1 << 20))
            language = getattr(self.runner, "remote_language", None) if isinstance(cases[0], IOCase) else "python"
            if language is None:
                raise ValueError(f"runner: {self.runner!r} has no remote_language for the remote sandbox")
            main = next(iter(files.values())) if isinstance(cases[0], IOCase) else program
            return RemoteProgram(service, main, language)
        kind = "io" if isinstance(cases[0], IOCase) else "assert"
        return programs.open_program(
            self.backend, self.limits, self.python, files, self.runner.command(), kind, self.config.cgroup
        )

    def _io(self, side, case: IOCase, deadline: float, failures: list[str]) -> bool:
        timeout = min(self.limits.wall_s, deadline - time.monotonic())
        if timeout <= 0:
            failures.append("the completion's time ran out")
            return False
        result = side.run(case.input, timeout)
        if "error" in result or result["timed_out"] or result["output_exceeded"]:
            failures.append(str(result.get("error") or ("timeout" if result["timed_out"] else "output too large")))
            return False
        return result["exit"] == 0 and same_output(result["stdout"], case.output)


class _AssertRun:
    """One completion's assert tests: the judge runs each, relaying its calls to the program's side."""

    def __init__(self, scorer: Scorer, side, deadline: float, failures: list[str]) -> None:
        self.scorer, self.side, self.deadline, self.failures = scorer, side, deadline, failures
        self.wall = scorer.limits.wall_s
        self.hung = False  # the program's load timed out: it hangs at import, and the tests left fail

    def run(self, cases: list[AssertCase]) -> list[bool]:
        judge = None
        passed = []
        try:
            for case in cases:
                if judge is None or not judge.healthy:
                    if judge is not None:
                        programs.release(judge)
                    scorer = self.scorer
                    judge = programs.judge(scorer.judge_level, scorer.limits, scorer.python, scorer.config.cgroup)
                passed.append(self.one(case, judge))
        finally:
            if judge is not None:
                programs.release(judge)
        return passed

    def one(self, case: AssertCase, judge: programs.Judge) -> bool:
        if case.problem is not None:
            return False
        if self.hung or time.monotonic() >= self.deadline:
            self.failures.append("the program hung" if self.hung else "the completion's time ran out")
            return False
        test_end = min(time.monotonic() + self.wall, self.deadline)
        message, why = judge.ask(case.message(cpu_s=self.wall), self._timeout())
        loaded = False
        while message is not None and "call" in message:
            reply, failed = None, None
            if not loaded:
                reply, failed = self._ask({"op": "load", "fresh": True, "prelude": case.prelude}, test_end)
                self.hung = reply is None and str(failed).startswith("no answer: timeout")
                loaded = reply is not None and _says_loaded(reply)
            if loaded:
                reply, failed = self._ask(message["call"], test_end)
            if reply is None:
                self.failures.append(failed)
            message, why = judge.ask({"reply": reply} if reply is not None else {"failed": failed}, self._timeout())
        if message is None:
            self.failures.append(f"the judge failed on this program's answers: {why}")
            return False
        return message.get("done") is True

    def _ask(self, request: dict, test_end: float) -> tuple[str | None, str | None]:
        """The program's answer line to `request` within the test's time, or (None, why)."""
        left = test_end - time.monotonic()
        return self.side.ask(dumps(request), left) if left > 0 else (None, "the test's time ran out")

    def _timeout(self) -> float:
        """The judge's wall-clock time for one step: its CPU time is bounded per test (cpu_s, load-free);
        this only stops a test that catches that bound, so it is generous, within the completion's time."""
        return max(0.1, min(2 * self.wall + 2.0, self.deadline - time.monotonic() + 0.5))


def _says_loaded(line: str) -> bool:
    """Whether the program's answer line is {"loaded": true} (anything else, garbage included: no)."""
    try:
        answer = loads(line)
    except WireError:
        return False
    return isinstance(answer, dict) and answer.get("loaded") is True

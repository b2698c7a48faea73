"""The code verifier's start-up check: a known-correct and a known-wrong program through the real sandbox.

A verifier that cannot run programs (an interpreter the sandbox does not show, a mount it may not
make, a service it cannot reach) would score every completion 0 and teach the policy nothing, or
worse. `check(scorer, kinds)` scores both programs on assert tests ("assert") and, for Python and
shell runners, on stdin/stdout tests ("io"), with the scorer's own backend, limits, runner and
interpreter; the correct one must score 1.0 and the wrong one 0.0, each without a failure, else
VerifierStartupError names the cause. A program that scores wrong is scored again, up to ATTEMPTS times in
all: on a loaded machine one call can pass its time limit, while a sandbox that cannot run programs fails
every time. A check that passed is remembered for the process.
"""

from __future__ import annotations

import logging

from grpo_fast.rewards.code.cases import parse_cases
from grpo_fast.rewards.code.runners import PythonRunner, ShellRunner
from grpo_fast.rewards.outcomes import InfrastructureError, ProgramFailure, VerifierStartupError

log = logging.getLogger(__name__)

_ASSERTS = ("def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n")
_ASSERT_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0 and isinstance(add(2, 2), int)"]
_IO_TESTS = [{"input": "1 2\n", "output": "3\n"}, {"input": "-1 1\n", "output": "0\n"}]
_IO = {
    PythonRunner: (
        "a, b = map(int, input().split())\nprint(a + b)\n",
        "a, b = map(int, input().split())\nprint(a - b)\n",
    ),
    ShellRunner: ("read a b\necho $((a + b))\n", "read a b\necho $((a - b))\n"),
}


ATTEMPTS = 3
_passed: set = set()


def check(scorer, kinds: set[str]) -> None:
    """Raise VerifierStartupError unless `scorer` (reward.Scorer) scores the known programs right, for
    each kind of test in `kinds` ("assert", "io")."""
    for kind in kinds:
        try:
            if (scorer, kind) in _passed:
                continue
        except TypeError:  # a runner that cannot be hashed: checked every time
            _check(scorer, kind)
            continue
        _check(scorer, kind)
        _passed.add((scorer, kind))


def _check(scorer, kind: str) -> None:
    if kind == "assert":
        runs = [("assert tests", _ASSERTS, _ASSERT_TESTS)]
    elif type(scorer.runner) in _IO:
        runs = [("stdin/stdout tests", _IO[type(scorer.runner)], _IO_TESTS)]
    else:
        log.info("code_tests: no start-up check of the stdin/stdout runner %r", scorer.runner)
        return
    for what, (correct, wrong), tests in runs:
        for program, expected in ((correct, 1.0), (wrong, 0.0)):
            for _ in range(ATTEMPTS):
                try:
                    reward = scorer.score(program, parse_cases(tests))
                except InfrastructureError as exc:
                    raise VerifierStartupError(f"code_tests start-up check ({scorer.backend} backend): {exc}") from exc
                if reward == expected and not isinstance(reward, ProgramFailure):
                    break
            else:
                cause = reward.reason if isinstance(reward, ProgramFailure) else "no failure reported"
                raise VerifierStartupError(
                    f"code_tests start-up check ({scorer.backend} backend, python {scorer.python}): a known-"
                    f"{'correct' if expected else 'wrong'} program scored {reward} on {what} instead of {expected} "
                    f"({cause}; {ATTEMPTS} tries). The sandbox cannot run programs as configured; nothing it "
                    "scored could be trusted."
                )
    log.info("code_tests: start-up check of %s passed (%s backend)", what, scorer.backend)

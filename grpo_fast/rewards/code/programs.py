"""The two sides of an assert test on this machine: the program's sandbox and the judge.

- `LocalProgram`: one completion's program in a local sandbox (sandbox.Session): stdin/stdout runs,
  and the call runner (call_runner.py) that answers an assert test's requests one line at a time.
- `Judge`: a judge runner (judge_runner.py) in a sandbox of its own, which never runs a program; idle
  ones are kept per process for the next completion (`judge()` / `release()`, `close_judges()`),
  since a judge only ever holds the tests' own code and plain data.

Both answer "ask" with (the answer line, None) or (None, why it failed). A failure before anything of
the completion ran (the sandbox or the runner cannot start) is an InfrastructureError instead.
"""

from __future__ import annotations

import atexit
import math
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_fast.rewards.code.sandbox import SandboxLimits, Session
from grpo_fast.rewards.code.wire import WireError, dumps, loads
from grpo_fast.rewards.outcomes import InfrastructureError

_HERE = Path(__file__).parent
_WIRE = (_HERE / "wire.py").read_text(encoding="utf-8")
CALL_RUNNER = _WIRE + (_HERE / "call_runner.py").read_text(encoding="utf-8")
JUDGE_RUNNER = _WIRE + (_HERE / "judge_runner.py").read_text(encoding="utf-8")
_JUDGE_CPU_S = 1 << 30  # the judge lives long: its tests are bounded one by one (cpu_s and wall clock)


class LocalProgram:
    """A completion's program in a local sandbox of backend `level` (see module doc)."""

    def __init__(
        self, level: str, limits: SandboxLimits, python: str, files: Mapping[str, str], command: list[str], tests: int
    ) -> None:
        self.limits, self.python, self.command = limits, python, command
        self.session = Session(level, limits, python, files, cpu_s=(math.ceil(limits.wall_s) + 1) * (tests + 1))
        self.serving = self.started_once = False

    def run(self, stdin: str, timeout: float) -> dict[str, Any]:
        """A stdin/stdout run of `command` (_launcher.py's "run" answer, or {"error": ...})."""
        self.serving = False
        return self.session.request({"op": "run", "argv": self.command, "stdin": stdin}, timeout)

    def ask(self, line: str, timeout: float) -> tuple[str | None, str | None]:
        """The call runner's answer to `line`, starting the runner first where none is running."""
        if not self.serving:
            argv = [self.python, "-I", "-c", CALL_RUNNER, "solution.py"]
            started = self.session.request({"op": "start", "argv": argv}, 10.0 + self.limits.wall_s)
            if started.get("started") is not True:
                if not self.started_once:
                    raise InfrastructureError(f"the call runner does not start in the sandbox: {_why(started)}")
                return None, _why(started)
            self.serving = self.started_once = True
        answer = self.session.request({"op": "ask", "line": line}, timeout)
        if "reply" in answer:
            return answer["reply"], None
        self.serving = False
        return None, _why(answer)

    def close(self) -> None:
        self.session.close()


class Judge:
    """A judge runner in its own sandbox (see module doc); raises InfrastructureError if it cannot start."""

    def __init__(self, level: str, limits: SandboxLimits, python: str) -> None:
        self.key = (level, limits, python)
        self.session = Session(level, limits, python, {}, cpu_s=_JUDGE_CPU_S)
        argv = [python, "-I", "-c", JUDGE_RUNNER]
        started = self.session.request({"op": "start", "argv": argv}, 30.0 + limits.wall_s)
        if started.get("started") is not True:
            self.session.close()
            raise InfrastructureError(f"the judge does not start in the sandbox: {_why(started)}")
        self.healthy = True

    def ask(self, message: Mapping[str, Any], timeout: float) -> tuple[dict[str, Any] | None, str | None]:
        """The judge's next message after `message`, or (None, why) when it failed (it is then unusable)."""
        answer = self.session.request({"op": "ask", "line": dumps(message)}, timeout)
        if "reply" in answer:
            try:
                reply = loads(answer["reply"])
            except WireError:
                reply = None
            if isinstance(reply, dict):
                return reply, None
        self.healthy = False
        return None, _why(answer)

    def close(self) -> None:
        self.session.close()


def _why(answer: Mapping[str, Any]) -> str:
    why = str(answer.get("error") or answer)[:300]
    stderr = str(answer.get("stderr") or "").strip()
    return f"{why}: {stderr[-500:]}" if stderr else why


_idle: dict[tuple, list[Judge]] = {}
_lock = threading.Lock()


def _owner() -> tuple[int, int]:
    """Who may reuse a judge: the process and thread that started it (its launcher dies with that
    thread: a parent-death signal follows the thread that forked; a forked child must not share it)."""
    return os.getpid(), threading.get_ident()


def judge(level: str, limits: SandboxLimits, python: str) -> Judge:
    """An idle judge for these settings (started if none is idle); give it back with `release`."""
    with _lock:
        idle = _idle.get((*_owner(), level, limits, python), [])
        while idle:
            candidate = idle.pop()
            if candidate.session.proc.poll() is None:
                return candidate
            candidate.close()
    return Judge(level, limits, python)


def release(used: Judge) -> None:
    """Keep a healthy judge for the next caller; close a failed one."""
    if not used.healthy or used.session.proc.poll() is not None:
        used.close()
        return
    with _lock:
        _idle.setdefault((*_owner(), *used.key), []).append(used)


@atexit.register
def close_judges() -> None:
    """Stop this process's idle judges (the next `judge()` starts a new one)."""
    with _lock:
        for key, judges in list(_idle.items()):
            if key[0] == os.getpid():
                for idle in judges:
                    idle.close()
                del _idle[key]

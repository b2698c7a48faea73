"""The two sides of an assert test on this machine: the program's sandbox and the judge.

- `LocalProgram`: one completion's program in a local sandbox (sandbox.Session): stdin/stdout runs,
  and the call runner (call_runner.py) that answers an assert test's requests one line at a time.
  `open_program` gives one and has the next one set up (launcher, sandbox and runner started, no
  program yet) while the completion is scored: most of a sandbox's start is off the critical path.
- `Judge`: a judge runner (judge_runner.py) in a sandbox of its own, which never runs a program; idle
  ones are kept per process for the next completion (`judge()` / `release()`, `close_idle()`),
  since a judge only ever holds the tests' own code and plain data.

Both answer "ask" with (the answer line, None) or (None, why it failed). A failure before anything of
the completion ran (the sandbox or the runner cannot start) is an InfrastructureError instead.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_fast.errors import InfrastructureError
from grpo_fast.rewards.code.wire import WireError, dumps, loads
from grpo_fast.sandbox import RUNNER_CHANNEL, SandboxLimits, Session, reap, runner_argv

_HERE = Path(__file__).parent
_WIRE = (_HERE / "wire.py").read_text(encoding="utf-8")
CALL_RUNNER = RUNNER_CHANNEL + _WIRE + (_HERE / "call_runner.py").read_text(encoding="utf-8")
JUDGE_RUNNER = RUNNER_CHANNEL + _WIRE + (_HERE / "judge_runner.py").read_text(encoding="utf-8")
_JUDGE_CPU_S = 1 << 30  # the judge lives long: its tests are bounded one by one (cpu_s and wall clock)
_START_S = 10.0  # how long a runner may take to start (before anything of a completion runs in it)


_lock = threading.Lock()


def _owner() -> tuple[int, int]:
    """Who may reuse a judge or a sandbox set up ahead: the process and thread that started it (its
    launcher dies with that thread: a parent-death signal follows the thread that forked; a forked
    child must not share it)."""
    return os.getpid(), threading.get_ident()


class LocalProgram:
    """A completion's program in a local sandbox of backend `level` (see module doc). `kind`: "assert"
    (the call runner, started with the sandbox) or "io" (stdin/stdout runs of `command`). Get one with
    `open_program`, which has the next one set up while this one is used."""

    def __init__(
        self, level: str, limits: SandboxLimits, python: str, command: list[str], kind: str, cgroup_parent: str | None
    ) -> None:
        self.limits, self.python, self.command, self.kind = limits, python, command, kind
        wall = limits.completion_s if kind == "assert" else limits.wall_s
        self.session = Session(level, limits, python, {}, cpu_s=limits.process_cpu_s(wall), cgroup_parent=cgroup_parent)
        self.serving = False
        if kind == "assert":
            self.session.post({"op": "start", "argv": self._runner()}, _START_S + limits.wall_s)

    def _runner(self) -> list[str]:
        return runner_argv(self.python, CALL_RUNNER, "solution.py")

    def begin(self, files: Mapping[str, str]) -> None:
        """Wait for the sandbox (and the call runner) to be up, then write the program's files.
        InfrastructureError when either fails: nothing of the completion has run yet."""
        self.session.ready()
        if self.kind == "assert":
            started = self.session.collect()
            if started.get("started") is not True:
                self.close()
                raise InfrastructureError(f"the call runner does not start in the sandbox: {_why(started)}")
            self.serving = True
        written = self.session.request({"op": "write", "files": dict(files)}, _START_S)
        if written.get("written") is not True:
            self.close()
            raise InfrastructureError(f"the sandbox does not take the program: {_why(written)}")

    def run(self, stdin: str, timeout: float) -> dict[str, Any]:
        """A stdin/stdout run of `command` (_launcher.py's "run" answer, or {"error": ...})."""
        self.serving = False
        return self.session.request({"op": "run", "argv": self.command, "stdin": stdin}, timeout)

    def ask(self, line: str, timeout: float) -> tuple[str | None, str | None]:
        """The call runner's answer to `line`, starting a new runner first after one failed."""
        if not self.serving:
            started = self.session.request({"op": "start", "argv": self._runner()}, _START_S + self.limits.wall_s)
            if started.get("started") is not True:
                return None, _why(started)
            self.serving = True
        answer = self.session.request({"op": "ask", "line": line}, timeout)
        if isinstance(answer.get("reply"), str):
            return answer["reply"], None
        self.serving = False
        return None, _why(answer)

    def alive(self) -> bool:
        return not self.session.closed and self.session.proc.poll() is None

    def close(self) -> None:
        self.session.close()


_spares: dict[tuple, LocalProgram] = {}


def open_program(
    level: str,
    limits: SandboxLimits,
    python: str,
    files: Mapping[str, str],
    command: list[str],
    kind: str,
    cgroup_parent: str | None = None,
) -> LocalProgram:
    """A sandbox holding `files` (see LocalProgram): the one set up ahead for these settings if it is
    alive, else a new one; and a new one is set up ahead for the next call. Sandboxes set up ahead
    have run nothing of any completion."""
    key = (*_owner(), level, limits, python, tuple(command), kind, cgroup_parent)
    with _lock:
        program = _spares.pop(key, None)
    if program is None or not program.alive():
        if program is not None:
            program.close()
        program = LocalProgram(level, limits, python, command, kind, cgroup_parent)
    spare = LocalProgram(level, limits, python, command, kind, cgroup_parent)
    with _lock:
        _spares[key] = spare
    program.begin(files)
    return program


class Judge:
    """A judge runner in its own sandbox (see module doc); raises InfrastructureError if it cannot start."""

    def __init__(self, level: str, limits: SandboxLimits, python: str, cgroup_parent: str | None = None) -> None:
        self.key = (level, limits, python, cgroup_parent)
        self.session = Session(level, limits, python, {}, cpu_s=_JUDGE_CPU_S, cgroup_parent=cgroup_parent)
        started = self.session.request({"op": "start", "argv": runner_argv(python, JUDGE_RUNNER)}, 30.0 + limits.wall_s)
        if started.get("started") is not True:
            self.session.close()
            raise InfrastructureError(f"the judge does not start in the sandbox: {_why(started)}")
        self.healthy = True

    def ask(self, message: Mapping[str, Any], timeout: float) -> tuple[dict[str, Any] | None, str | None]:
        """The judge's next message after `message`, or (None, why) when it failed (it is then unusable)."""
        answer = self.session.request({"op": "ask", "line": dumps(message)}, timeout)
        if isinstance(answer.get("reply"), str):
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


def judge(level: str, limits: SandboxLimits, python: str, cgroup_parent: str | None = None) -> Judge:
    """An idle judge for these settings (started if none is idle); give it back with `release`."""
    with _lock:
        idle = _idle.get((*_owner(), level, limits, python, cgroup_parent), [])
        while idle:
            candidate = idle.pop()
            if candidate.session.proc.poll() is None:
                return candidate
            candidate.close()
    return Judge(level, limits, python, cgroup_parent)


def release(used: Judge) -> None:
    """Keep a healthy judge for the next caller; close a failed one."""
    if not used.healthy or used.session.proc.poll() is not None:
        used.close()
        return
    with _lock:
        _idle.setdefault((*_owner(), *used.key), []).append(used)


@atexit.register
def close_idle() -> None:
    """Stop this process's idle judges and sandboxes set up ahead, and wait until they are gone (the
    next use starts new ones)."""
    with _lock:
        for key, judges in list(_idle.items()):
            if key[0] == os.getpid():
                for idle in judges:
                    idle.close()
                del _idle[key]
        for key, spare in list(_spares.items()):
            if key[0] == os.getpid():
                spare.close()
                del _spares[key]
    reap(block=True)

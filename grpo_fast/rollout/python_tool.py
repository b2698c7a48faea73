"""`PythonEnvironment`: a persistent Python interpreter as a tool, running in the code sandbox, for TRL's (1.16)
`GRPOTrainer(environment_factory=PythonEnvironment)` and any tool loop that keeps its contract.

The contract: instances are made by calling the factory with no arguments (the options here are keywords with
defaults: bind them with functools.partial); `reset(**row)` is called at the start of each rollout with its
dataset row; every other public method of the class is a tool, described to the model by its type hints and
docstring (transformers.utils.get_json_schema). The one tool is `python(code)`. `close` is an instance attribute
(a weakref.finalize), not a method, so that it is no tool; it also runs at garbage collection and at exit.

The interpreter (repl_runner.py) runs in a local sandbox (grpo_fast.sandbox.Session) of backend `sandbox` (a
SandboxConfig; "auto" = the strongest local backend, as code rewards choose it) with resources `limits`:
- The sandbox starts at a rollout's first call. `reset` drops the sandbox of the rollout before at once (a call
  still running there is abandoned), since what its code left there (files in /sandbox) would reach the next
  rollout.
- Each call may run `limits.wall_s` seconds, its processes together as many CPU seconds; the interpreter's CPU
  time for all of a rollout's calls is `limits.cpu_s`, by default ceil(limits.completion_s) + 1. Between two
  calls nothing of the code runs: the interpreter is stopped, every other process it started is killed, and
  shared memory is cleared (grpo_fast.sandbox._launcher).
- What the code prints or raises is the call's answer. What the code does to its own sandbox is the model's
  failure, never the run's: a call that runs out of its time, kills its interpreter, garbles its answer or
  breaks its sandbox raises `ToolCallFailed` (the tool loop gives the model its text and counts a failed call);
  the next call runs in a fresh interpreter, in the same sandbox (its files stay), or in a fresh sandbox where
  the sandbox itself was lost. Only what no code can cause raises InfrastructureError: no backend, or a fresh
  sandbox, or the interpreter in one, that cannot start (then nothing of the call has run).

Threads: a launcher dies with the thread that forked it (a parent-death signal follows that thread), and callers
run tools on worker threads that may end before the rollout does. So every sandbox of this module is created by
one daemon thread that lives as long as the process (`_spawn`); requests are then made from the calling thread,
one at a time per environment (a lock).

The remote backend (SandboxFusion) is not supported: it keeps nothing between requests, so each call would
have to replay every earlier cell of the rollout, with their time, output and randomness again. A config that
names it raises ValueError; "auto" that comes to it (no local backend, a URL set) raises InfrastructureError.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from grpo_fast.errors import InfrastructureError
from grpo_fast.sandbox import RUNNER_CHANNEL, SandboxConfig, SandboxLimits, Session, choose, runner_argv

REPL_RUNNER = RUNNER_CHANNEL + Path(__file__).with_name("repl_runner.py").read_text(encoding="utf-8")
_START_S = 10.0  # how long the interpreter may take to start, beyond `wall_s`
_ANSWER_BYTES_PER_CHAR = 12  # an answer's bound per character of output and error (repl_runner.py)
_NO_REMOTE = (
    "PythonEnvironment needs a local sandbox backend (namespaces or bwrap): the remote backend keeps no state "
    "between requests, so it cannot hold a persistent interpreter"
)
T = TypeVar("T")


class PythonEnvironment:
    """A persistent Python interpreter in a sandbox, one per rollout (see module doc).

    sandbox: backend (a SandboxConfig, a mapping of its fields, a backend name; None = "auto").
    limits: SandboxLimits or a mapping of its fields (wall_s: seconds per call).
    python: the interpreter to run in the sandbox (its site-packages are importable there).
    max_output_chars: what the model sees of a call's output, and of its traceback.
    """

    close: weakref.finalize
    """Stop the sandbox (also done at garbage collection and at exit); a later call raises RuntimeError."""

    def __init__(
        self,
        *,
        sandbox: SandboxConfig | Mapping[str, Any] | str | None = None,
        limits: SandboxLimits | Mapping[str, Any] | None = None,
        python: str = sys.executable,
        max_output_chars: int = 4000,
    ) -> None:
        config = SandboxConfig.of(sandbox)
        if config.backend == "remote":
            raise ValueError(_NO_REMOTE)
        self._interpreter = _Interpreter(config, SandboxLimits.of(limits), python, max_output_chars)
        self.close = weakref.finalize(self, self._interpreter.close)

    def reset(self, **row: Any) -> None:
        """Start a rollout (the dataset row is not used): the next call runs in a fresh interpreter and sandbox."""
        self._interpreter.drop()

    def python(self, code: str) -> str:
        """Runs Python code in a persistent interpreter; variables persist between calls of this rollout.

        Works like a notebook cell: the result is what the code prints, followed by the value of the last line
        when that is an expression. When the code raises an exception, the result ends with its traceback. Code
        that runs past the time limit is stopped and the interpreter restarted, which loses its variables.

        Args:
            code: Python statements to run.

        Returns:
            The output of the code, or an error text.
        """
        return self._interpreter.run(code)


class ToolCallFailed(Exception):  # noqa: N818 - the model reads its name: "error: python: ToolCallFailed: ..."
    """The code made its call fail (see module doc); the text says how, for the model."""


class _Interpreter:
    """The sandbox and interpreter of one environment (see module doc). Calls hold `calls`, one at a time;
    `state` guards the session, which `drop` may take away from a call still running."""

    def __init__(self, config: SandboxConfig, limits: SandboxLimits, python: str, max_chars: int) -> None:
        if max_chars <= 0 or 2 * _ANSWER_BYTES_PER_CHAR * max_chars + 4096 > limits.output_bytes:
            raise ValueError(
                f"max_output_chars: must be > 0 and fit in limits.output_bytes ({limits.output_bytes}) at "
                f"{2 * _ANSWER_BYTES_PER_CHAR} bytes each (output and traceback), plus 4096; got {max_chars}"
            )
        self.config, self.limits, self.python = config, limits, python
        self.argv = runner_argv(python, REPL_RUNNER, str(max_chars))
        self.cpu_s = limits.process_cpu_s(limits.completion_s)
        self.session: Session | None = None
        self.serving = self.closed = False
        self.why: Mapping[str, Any] = {}  # the launcher's answer when the interpreter last failed to start
        self.calls, self.state = threading.Lock(), threading.Lock()

    def run(self, code: str) -> str:
        """The interpreter's answer to `code`; ToolCallFailed where the code made the call fail (see module doc)."""
        with self.calls:
            if self.closed:
                raise RuntimeError("PythonEnvironment: closed")
            session = self._serving()
            answer = session.request({"op": "ask", "line": json.dumps({"code": code})}, self.limits.wall_s)
            with self.state:
                current = self.session is session
            if not current:  # dropped during the call (reset, close): the call's answer is no one's
                session.close()
                raise ToolCallFailed("the rollout ended during the call")
            reply = _reply(answer.get("reply"))
            if reply is not None:
                return reply.get("output", "") + reply.get("error", "")
            if answer.get("launcher"):  # the sandbox itself is lost: the next call gets a fresh one
                self._drop()
                raise ToolCallFailed(
                    f"the sandbox failed ({answer['error']}); the next call runs in a fresh sandbox, the files and "
                    "variables of this one are lost"
                )
            self.serving = False  # the next call starts a fresh interpreter (the "start" op stops this one first)
            if "reply" in answer:
                answer = {"error": "a garbled answer"}
            raise ToolCallFailed(f"{self._failure(answer)}; the interpreter was restarted, its variables are lost")

    def _serving(self) -> Session:
        """The sandbox with an interpreter started in it: in this rollout's sandbox, else in a fresh one (where the
        interpreter does not start in a sandbox the code has used, that sandbox is dropped). InfrastructureError
        when a fresh sandbox, or the interpreter in it, cannot start."""
        if self.session is not None and self.serving:
            return self.session
        if self.session is not None:
            if self._start_interpreter(self.session):
                return self.session
            self._drop()
        session = _spawn(self._new_session)
        with self.state:
            self.session = session
        if not self._start_interpreter(session):
            self._drop()
            raise InfrastructureError(f"the Python tool's interpreter does not start in a fresh sandbox: {self.why}")
        return session

    def _new_session(self) -> Session:
        level = choose(self.config)
        if level == "remote":
            raise InfrastructureError(_NO_REMOTE)
        session = Session(level, self.limits, self.python, {}, cpu_s=self.cpu_s, cgroup_parent=self.config.cgroup)
        session.ready()
        return session

    def _start_interpreter(self, session: Session) -> bool:
        started = session.request({"op": "start", "argv": self.argv}, _START_S + self.limits.wall_s)
        self.serving = started.get("started") is True
        self.why = started
        return self.serving

    def _failure(self, answer: Mapping[str, Any]) -> str:
        """What the launcher's failed answer to a call means, for the model."""
        error = str(answer.get("error"))
        if error == "no answer: timeout":
            return f"timed out after {self.limits.wall_s:g} s"
        if error == "no answer: CPU time":
            return f"its processes used more than {self.limits.wall_s:g} CPU seconds"
        why = (
            "the interpreter exited" if error == "no answer: the runner exited" else f"the interpreter failed ({error})"
        )
        status = answer.get("exit")
        if isinstance(status, int) and status < 0:
            return f"{why}: {signal.strsignal(-status) or f'signal {-status}'}"
        return f"{why} with status {status}" if isinstance(status, int) else why

    def drop(self) -> None:
        """Stop the sandbox at once, if any: the next call starts a new one. A call still running there (abandoned
        by its caller) fails; its thread finishes closing the sandbox."""
        with self.state:
            session, self.session, self.serving = self.session, None, False
        if session is None:
            return
        if self.calls.acquire(blocking=False):
            try:
                session.close()
            finally:
                self.calls.release()
        else:
            session.kill()

    def close(self) -> None:
        self.closed = True
        self.drop()

    def _drop(self) -> None:
        """Drop the sandbox from the calling thread (which holds `calls`)."""
        with self.state:
            session, self.session, self.serving = self.session, None, False
        if session is not None:
            session.close()


def _reply(line: Any) -> dict[str, str] | None:
    """The runner's answer on `line` ({"output": text, "error": text}, either optional), or None."""
    try:
        reply = json.loads(line) if isinstance(line, str) else None
    except (ValueError, RecursionError):
        return None
    if (
        isinstance(reply, dict)
        and reply.keys() <= {"output", "error"}
        and all(isinstance(v, str) for v in reply.values())
    ):
        return reply
    return None


class _Spawner:
    """A daemon thread that lives as long as its process and runs the jobs given to `call`, in order."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="python-tool-sandboxes", daemon=True).start()

    def _serve(self) -> None:
        while True:
            job, future = self.jobs.get()
            try:
                future.set_result(job())
            except Exception as exc:  # noqa: BLE001 - raised again in the caller's thread
                future.set_exception(exc)

    def call(self, job: Callable[[], T]) -> T:
        future: Future = Future()
        self.jobs.put((job, future))
        return future.result()


_spawner: _Spawner | None = None
_lock = threading.Lock()


def _spawn(make: Callable[[], T]) -> T:
    """make() run on this process's spawner thread: the sandboxes it starts outlive the caller's thread."""
    global _spawner
    with _lock:
        if _spawner is None or _spawner.pid != os.getpid():
            _spawner = _Spawner()
    return _spawner.call(make)

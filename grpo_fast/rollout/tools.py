"""Tools a policy calls during a rollout: TRL 1.16's `tools` contract, run with a deadline per call.

A tool is a plain Python callable, sync or async, with type hints and a Google-style docstring; its JSON schema
comes from transformers' `get_json_schema` and goes to the chat template (`apply_chat_template(..., tools=...)`).
An environment's public methods are tools the same way (grpo_fast.rollout.environments).

What a call can do to the rollout: every call gets a result text for the model. A call of an unknown tool, with
arguments its schema does not admit (a missing or unknown argument, a value of the wrong JSON type), a tool that
raises, and one that runs past `timeout` each give an "error: ..." text and count as that tool's failure; none of
them stops the step. A tool that raises grpo_fast.errors.InfrastructureError (a sandbox that cannot start: nothing
the model did) stops it, loudly.

Where a call runs. Sync tools run where TRL runs them: in the trainer's thread, one call after another (a tool
may use `signal.alarm`, which works in the main thread only). On the main thread the deadline is a real-time
signal (`DEADLINE_SIGNAL`, never SIGALRM, so a tool's own `signal.alarm` keeps working) that raises `ToolTimeout`
(a BaseException: `except Exception` in the tool does not swallow it) in the tool at its deadline; it interrupts
a blocking system call (sleep, a socket read) but not C code that never returns to Python (a long sqlite query
stops when it does), and a call that returns after its deadline counts as timed out. Off the main thread (the
trainer itself run from another thread), and for every sync call when the user opts into parallel tool workers
(`workers` > 1: the rollouts' calls on a thread pool), a call runs in a daemon thread of its own and, past its
deadline, keeps running there (Python cannot stop a thread): a tool that must be stoppable runs its work in a
process (grpo_fast.rollout.python_tool does). Async tools run on one event loop thread of the runner's, as
TRL runs them, and are cancelled at their deadline.
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from grpo_fast.errors import InfrastructureError

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


@dataclass(frozen=True)
class Tool:
    """A callable the model may call by `name`; `schema` is its JSON schema ({"type": "function", "function":
    {"name", "description", "parameters"}}), as the chat template receives it."""

    name: str
    fn: Callable
    schema: dict

    @classmethod
    def of(cls, fn: Callable) -> Tool:
        """The tool of `fn`; ValueError naming it when transformers cannot describe it (type hints and a
        Google-style docstring with an Args section are required, as TRL requires them)."""
        from transformers.utils import get_json_schema

        try:
            schema = get_json_schema(fn)
        except Exception as exc:  # noqa: BLE001 - transformers raises several types for an undescribable function
            raise ValueError(
                f"tool {getattr(fn, '__qualname__', fn)!r}: cannot build its JSON schema ({exc}); a tool needs type "
                "hints on every argument and a Google-style docstring with an Args: section"
            ) from exc
        return cls(schema["function"]["name"], fn, schema)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def argument_error(self, arguments: Any) -> str | None:
        """Why `arguments` do not fit this tool's schema (missing, unknown, or of the wrong JSON type), or None."""
        if not isinstance(arguments, Mapping):
            return f"arguments must be an object of named values, got {type(arguments).__name__}"
        params = self.schema["function"].get("parameters", {})
        properties = params.get("properties", {})
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            return f"unknown argument(s) {unknown}; {self.name} takes {sorted(properties)}"
        missing = sorted(set(params.get("required", [])) - set(arguments))
        if missing:
            return f"missing argument(s) {missing}"
        for key, value in arguments.items():
            expected = _types_of(properties[key])
            ok = any(isinstance(value, _JSON_TYPES.get(t, object)) for t in expected)
            if expected and (not ok or (isinstance(value, bool) and "boolean" not in expected)):
                return f"argument {key!r} must be {' or '.join(expected)}, got {value!r}"
        return None


def _types_of(schema: Mapping) -> list[str]:
    """The JSON types a property's schema admits (its "type", a list of them, or the branches of anyOf)."""
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else list(declared or [])
    for branch in schema.get("anyOf", []):
        types += _types_of(branch)
    if schema.get("nullable"):
        types.append("null")
    return types


@dataclass(frozen=True)
class ToolResult:
    """One call's outcome: the `text` the model reads, `failure` (why it failed, None when it did not), `seconds`."""

    name: str
    text: str
    failure: str | None
    seconds: float


class ToolRunner:
    """Runs tool calls with a deadline of `timeout` seconds each (see the module doc for where): sync tools in the
    calling thread, or with `workers` > 1 the rollouts' calls on that many threads (`map`); async tools on one
    event loop thread of the runner's (started at the first async call)."""

    def __init__(self, timeout: float, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"rollout.tool_workers: expected at least 1, got {workers}")
        self.timeout, self.workers = timeout, workers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def map(self, fn: Callable[[Any], Any], items: Iterable) -> list:
        """fn over `items` (one rollout's tool calls each): one after another in the calling thread, or on the
        runner's `workers` threads."""
        if self.workers == 1:
            return [fn(item) for item in items]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="tool-rollout")
        return list(self._pool.map(fn, items))

    def call(self, tools: Mapping[str, Tool], call: Mapping) -> ToolResult:
        """Run one parsed tool call ({"type": "function", "function": {"name", "arguments"}}) with `tools`."""
        start = time.perf_counter()
        function = call.get("function") if isinstance(call, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str):
            return ToolResult("unknown", f"error: malformed tool call {call!r}", "malformed", 0.0)
        tool = tools.get(name)
        if tool is None:
            text = f"error: no tool named {name!r}; the tools are {sorted(tools)}"
            return ToolResult(name, text, "unknown_tool", 0.0)
        arguments = function.get("arguments", {})
        why = tool.argument_error(arguments)
        if why is not None:
            return ToolResult(name, f"error: {name}: {why}", "bad_arguments", 0.0)
        outcome = self._run_async(tool, arguments) if tool.is_async else self._run_sync(tool, arguments)
        seconds = time.perf_counter() - start
        if isinstance(outcome, _Broken):
            raise outcome.error
        if isinstance(outcome, _Failed):
            return ToolResult(name, f"error: {name}: {outcome.why}", outcome.kind, seconds)
        return ToolResult(name, outcome if isinstance(outcome, str) else str(outcome), None, seconds)

    def run(self, coroutine) -> Any:
        """The result of `coroutine`, run on the runner's event loop (where its async tools run)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._event_loop()).result()

    def _run_sync(self, tool: Tool, arguments: Mapping) -> Any:
        if self.workers == 1 and _DEADLINE.usable():
            return self._run_here(tool, arguments)
        return self._run_in_thread(tool, arguments)

    def _run_here(self, tool: Tool, arguments: Mapping) -> Any:
        """The call in this (the main) thread, interrupted at its deadline by DEADLINE_SIGNAL."""
        start = time.perf_counter()
        try:
            try:
                _DEADLINE.arm(self.timeout)
                value = _outcome(tool, arguments)
            finally:
                _DEADLINE.disarm()
        except ToolTimeout:
            value = None
        late = time.perf_counter() - start > self.timeout  # a tool that caught the interrupt and returned late, too
        if value is None or (late and not isinstance(value[0], _Broken)):
            return _Failed("timeout", f"timed out after {self.timeout:g} s")
        return value[0]

    def _run_in_thread(self, tool: Tool, arguments: Mapping) -> Any:
        box: list = []
        thread = threading.Thread(target=lambda: box.append(_outcome(tool, arguments)), name=f"tool-{tool.name}")
        thread.daemon = True
        thread.start()
        thread.join(self.timeout)
        if not box:
            return _Failed("timeout", f"timed out after {self.timeout:g} s")
        return box[0][0]

    def _run_async(self, tool: Tool, arguments: Mapping) -> Any:
        """The call on the event loop, cancelled at its deadline. A coroutine that blocks the loop (time.sleep)
        cannot be cancelled: past its deadline and LOOP_GRACE_SECONDS it counts as timed out, and the loop, still
        blocked, is left to it (the next async call starts a new one). One that returns after its deadline (it
        caught the cancellation) counts as timed out too."""

        async def bounded():
            return await asyncio.wait_for(tool.fn(**arguments), self.timeout)

        start, loop = time.perf_counter(), self._event_loop()
        future = asyncio.run_coroutine_threadsafe(bounded(), loop)
        try:
            value = future.result(self.timeout + LOOP_GRACE_SECONDS)
        except TimeoutError:
            if not future.done():  # the loop never got back to cancel it
                future.cancel()
                self._abandon(loop)
            return _Failed("timeout", f"timed out after {self.timeout:g} s")
        except InfrastructureError:
            raise
        except Exception as exc:  # noqa: BLE001 - a tool's exception is the model's to read
            return _Failed("raised", f"{type(exc).__name__}: {exc}")
        if time.perf_counter() - start > self.timeout:
            return _Failed("timeout", f"timed out after {self.timeout:g} s")
        return value

    def _abandon(self, loop: asyncio.AbstractEventLoop) -> None:
        """Leaves a blocked event loop to its thread (a daemon), stopping it should it ever return."""
        with self._lock:
            if self._loop is loop:
                self._loop = None
        loop.call_soon_threadsafe(loop.stop)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="tool-event-loop", daemon=True).start()
            return self._loop

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None


def _outcome(tool: Tool, arguments: Mapping) -> tuple[Any]:
    """(the sync tool's value,), or (_Failed,) when it raised, (_Broken,) when it raised InfrastructureError."""
    try:
        return (tool.fn(**arguments),)
    except InfrastructureError as exc:  # ours, not the model's: raised in the caller
        return (_Broken(exc),)
    except Exception as exc:  # noqa: BLE001 - a tool's exception is the model's to read
        return (_Failed("raised", f"{type(exc).__name__}: {exc}"),)


LOOP_GRACE_SECONDS = 1.0
"""How long past an async call's deadline its cancellation may take to arrive before its event loop counts as
blocked."""


class ToolTimeout(BaseException):
    """Raised in a sync tool running on the main thread when its deadline passes (a BaseException, so that the
    tool's own `except Exception` lets it through)."""


DEADLINE_SIGNAL = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else None
"""The real-time signal that interrupts a sync tool on the main thread at its deadline (SIGALRM stays the tool's)."""


class _MainThreadDeadline:
    """One deadline at a time for the call running on the main thread: a timer thread sends DEADLINE_SIGNAL to it,
    whose handler raises ToolTimeout there. A signal that arrives after the call ended finds nothing armed and
    does nothing; the handler stays installed (a no-op between calls), so a late signal never meets the default
    action (which would end the process)."""

    def __init__(self) -> None:
        self._armed: object | None = None  # the token of the call under way
        self._raised = False
        self._installed = False
        self._timer: threading.Timer | None = None

    def usable(self) -> bool:
        """Whether a call in this thread can be interrupted: the main thread, on a system with real-time signals."""
        main = threading.current_thread() is threading.main_thread()
        return main and DEADLINE_SIGNAL is not None and hasattr(signal, "pthread_kill")

    def arm(self, seconds: float) -> None:
        if not self._installed:
            signal.signal(DEADLINE_SIGNAL, self._handle)
            self._installed = True
        token, target = object(), threading.main_thread().ident
        self._armed, self._raised = token, False

        def fire() -> None:
            if self._armed is token:
                signal.pthread_kill(target, DEADLINE_SIGNAL)

        timer = threading.Timer(seconds, fire)
        timer.daemon = True
        timer.start()
        self._timer = timer

    def disarm(self) -> None:
        self._armed = None
        if self._timer is not None:
            self._timer.cancel()

    def _handle(self, signum, frame) -> None:
        if self._armed is not None and not self._raised:
            self._raised = True
            raise ToolTimeout


_DEADLINE = _MainThreadDeadline()


@dataclass(frozen=True)
class _Failed:
    kind: str
    why: str


@dataclass(frozen=True)
class _Broken:
    error: InfrastructureError

"""Tools a policy calls during a rollout: TRL 1.16's `tools` contract, run with a deadline per call.

A tool is a plain Python callable, sync or async, with type hints and a Google-style docstring; its JSON schema
comes from transformers' `get_json_schema` and goes to the chat template (`apply_chat_template(..., tools=...)`).
An environment's public methods are tools the same way (grpo_fast.rollout.environments).

What a call can do to the rollout: every call gets a result text for the model. A call of an unknown tool, with
arguments its schema does not admit (a missing or unknown argument, a value of the wrong JSON type), a tool that
raises, and one that runs past `timeout` each give an "error: ..." text and count as that tool's failure; none of
them stops the step. A tool that raises grpo_fast.errors.InfrastructureError (a sandbox that cannot start: nothing
the model did) stops it, loudly. A sync tool past its deadline keeps running in its daemon thread (Python cannot stop a
thread): a tool that must be stoppable runs its work in a process (grpo_fast.rollout.python_tool does); an
async tool past its deadline is cancelled.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable, Mapping
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
    """Runs tool calls with a deadline each: sync tools in a daemon thread per call, async tools on one event loop
    thread of the runner's (started at the first async call)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

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

    def _run_sync(self, tool: Tool, arguments: Mapping) -> Any:
        box: list = []

        def target() -> None:
            try:
                box.append(tool.fn(**arguments))
            except InfrastructureError as exc:  # ours, not the model's: raised in the caller
                box.append(_Broken(exc))
            except Exception as exc:  # noqa: BLE001 - a tool's exception is the model's to read
                box.append(_Failed("raised", f"{type(exc).__name__}: {exc}"))

        thread = threading.Thread(target=target, name=f"tool-{tool.name}", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if not box:
            return _Failed("timeout", f"timed out after {self.timeout:g} s")
        return box[0]

    def _run_async(self, tool: Tool, arguments: Mapping) -> Any:
        async def bounded():
            return await asyncio.wait_for(tool.fn(**arguments), self.timeout)

        future = asyncio.run_coroutine_threadsafe(bounded(), self._event_loop())
        try:
            return future.result()
        except TimeoutError:
            return _Failed("timeout", f"timed out after {self.timeout:g} s")
        except InfrastructureError:
            raise
        except Exception as exc:  # noqa: BLE001 - a tool's exception is the model's to read
            return _Failed("raised", f"{type(exc).__name__}: {exc}")

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="tool-event-loop", daemon=True).start()
            return self._loop

    def close(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None


@dataclass(frozen=True)
class _Failed:
    kind: str
    why: str


@dataclass(frozen=True)
class _Broken:
    error: InfrastructureError

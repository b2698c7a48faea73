"""Environments: TRL 1.16's `environment_factory` contract.

A factory (anything callable with no arguments: a class, a function) gives one environment instance per rollout,
so rollouts never share state. An instance must have a callable `reset(**row)`, called with the rollout's dataset
row before generation; text it returns is appended to the prompt's last user message. Its other public methods
(not starting with "_"; a public `close` too, as in TRL) are its tools (grpo_fast.rollout.tools.Tool: type hints
and a Google-style docstring). An optional `get_reward()`, sync or async (awaited on the tool runner's event loop,
where the async tools run), scores the finished rollout from the environment's state (the `environment_reward`
reward, weight 1). A `{name: factory}` mapping lets one run mix environments: each row then names its own in its
`environment` column, and its prompt shows only that environment's tools. A row without a `prompt` column gets
TRL's placeholder, one empty user message (`PlaceholderPrompt`, never passed to reset), which reset's text fills.

Instances are pooled per environment and reused from step to step (constructed once, reset every rollout), as
TRL does: a rollout holds its instance from `acquire` until `release`, and the pool grows to the most instances of
one environment held at once. An instance whose method timed out is discarded: a method past its deadline may still
be changing the instance (in a worker thread that cannot be stopped) or have stopped half-way, so it is never reset
and reused. The call's result tells the model it timed out; the rollout's later calls of that environment's methods
get an error without running; `get_reward()` is not asked (its state is not the model's doing alone), and the
rollout's environment reward is the lowest any other rollout handed out with it got (the call's rollouts in sync
mode, the step's in partial and async; 0.0 when none did): a rollout never gains by running its environment out of
time. A fresh instance takes its place in the pool.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from grpo_fast.rollout.tools import Tool, ToolResult, ToolRunner

NOT_TOOLS = ("reset", "get_reward")


class PlaceholderPrompt(list):
    """The prompt of a row without one in a run whose environments' reset() supplies it: TRL's single empty user
    message. A list of chat messages like any prompt; its type marks it so that reset() never receives it."""

    def __init__(self) -> None:
        super().__init__([{"role": "user", "content": ""}])


def with_placeholder_prompts(rows: list[dict]) -> list[dict]:
    """`rows`, those without a "prompt" column given a PlaceholderPrompt (the environment's reset supplies it)."""
    return [row if "prompt" in row else {**row, "prompt": PlaceholderPrompt()} for row in rows]


def environment_tools(instance: object) -> list[Tool]:
    """The tools of an environment instance: its public methods other than reset and get_reward, bound."""
    members = inspect.getmembers(type(instance), predicate=inspect.isfunction)
    return [Tool.of(getattr(instance, name)) for name, _ in members if name not in NOT_TOOLS and not name[0] == "_"]


@dataclass
class Environments:
    """The run's environment factories by name (None: the one factory of a run without an `environment` column)."""

    factories: dict[str | None, Callable[[], object]]

    @classmethod
    def of(cls, factory: Callable[[], object] | Mapping[str, Callable[[], object]]) -> Environments:
        """From TRL's `environment_factory`: one factory, or {name: factory}. Probes one instance of each (kept for
        the pool): ValueError naming the factory when it has no callable `reset` or a method is not a valid tool."""
        factories = dict(factory) if isinstance(factory, Mapping) else {None: factory}
        if not factories:
            raise ValueError("environment_factory: expected a factory or a non-empty {name: factory} mapping")
        envs = cls(factories)
        for name, make in factories.items():
            if not callable(make):
                raise ValueError(f"environment_factory[{name!r}]: expected a callable, got {make!r}")
            envs._pool[name] = [envs._checked(name, make())]
        return envs

    def __post_init__(self) -> None:
        self._pool: dict[str | None, list[object]] = {}
        self._held: set[int] = set()  # ids of the instances rollouts hold
        self._discarded: list[object] = []  # taken out of the pool, until their rollouts are scored

    @property
    def routed(self) -> bool:
        """Whether rows choose their environment by their `environment` column."""
        return None not in self.factories

    def name_of(self, row: Mapping) -> str | None:
        """The environment of a dataset row; ValueError when a routed run's row names none or an unknown one."""
        if not self.routed:
            return None
        name = row.get("environment")
        if name not in self.factories:
            raise ValueError(
                f"dataset row environment={name!r}: expected one of {sorted(self.factories)} (the names of "
                "environment_factory)"
            )
        return name

    def acquire(self, names: list[str | None]) -> list[object]:
        """One distinct instance per rollout of environments `names`, none held by another rollout (pooled
        instances first, new ones made as needed), held until `release`. The caller resets them."""
        out = []
        for name in names:
            pool = self._pool[name]
            instance = next((e for e in pool if id(e) not in self._held), None)
            if instance is None:
                instance = self._checked(name, self.factories[name]())
                pool.append(instance)
            self._held.add(id(instance))
            out.append(instance)
        return out

    def release(self, instances: list[object]) -> None:
        """Returns instances to the pool, for later rollouts to reuse (a discarded one is not in it: forgotten)."""
        self._held -= {id(e) for e in instances}
        self._discarded = [x for x in self._discarded if not any(x is y for y in instances)]

    def reset(self, instance: object, row: Mapping) -> str | None:
        """reset(**row) of a rollout's instance, as TRL calls it: without the routing `environment` column of a
        routed run, and without a placeholder prompt. Returns what it returned (text for the prompt, or None)."""
        kwargs = {k: v for k, v in row.items() if not (k == "environment" and self.routed)}
        if isinstance(kwargs.get("prompt"), PlaceholderPrompt):
            del kwargs["prompt"]
        return instance.reset(**kwargs)

    def call(self, instance: object, runner: ToolRunner, tools: Mapping[str, Tool], call: Mapping) -> ToolResult:
        """One tool call of the rollout whose environment is `instance` (see the module doc for a timed-out one)."""
        function = call.get("function") if isinstance(call, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        tool = tools.get(name) if isinstance(name, str) else None
        own = tool is not None and getattr(tool.fn, "__self__", None) is instance
        if own and self.is_discarded(instance):
            why = "the environment was discarded after an earlier call timed out; its tools no longer run"
            return ToolResult(name, f"error: {name}: {why}", "discarded", 0.0)
        result = runner.call(tools, call)
        if own and result.failure == "timeout":
            self.discard(instance)
            text = f"{result.text}; the environment was discarded (its tools no longer run in this rollout)"
            return ToolResult(result.name, text, result.failure, result.seconds)
        return result

    def discard(self, instance: object) -> None:
        """Take `instance` out of its pool for good (a fresh one is made when a step needs it)."""
        self._discarded.append(instance)
        for pool in self._pool.values():
            pool[:] = [x for x in pool if x is not instance]

    def is_discarded(self, instance: object) -> bool:
        return any(x is instance for x in self._discarded)

    def reward(self, instance: object, runner: ToolRunner) -> float | None:
        """A finished rollout's environment reward: its instance's get_reward() (awaited on `runner`'s event loop
        when it is a coroutine function); None without one, or when the instance was discarded (its state is not
        the model's doing alone: the caller gives it the lowest reward of the rollouts scored with it)."""
        get_reward = getattr(instance, "get_reward", None)
        if self.is_discarded(instance) or not callable(get_reward):
            return None
        value = runner.run(get_reward()) if inspect.iscoroutinefunction(get_reward) else get_reward()
        return None if value is None else float(value)

    def has_reward(self) -> bool:
        return any(callable(getattr(pool[0], "get_reward", None)) for pool in self._pool.values() if pool)

    def close(self) -> None:
        """Closes every pooled instance that has a `close()` (a sandbox session, a connection)."""
        for pool in self._pool.values():
            for instance in pool:
                close = getattr(instance, "close", None)
                if callable(close):
                    close()
        self._pool.clear()
        self._held.clear()

    def _checked(self, name: str | None, instance: object) -> object:
        if not callable(getattr(instance, "reset", None)):
            label = "environment_factory" if name is None else f"environment_factory[{name!r}]"
            raise ValueError(f"{label}: the instance it made ({type(instance).__name__}) has no callable reset()")
        environment_tools(instance)  # every tool must be describable now, not at the first call
        return instance

"""Environments: TRL 1.16's `environment_factory` contract.

A factory (anything callable with no arguments: a class, a function) gives one environment instance per rollout,
so rollouts never share state. An instance must have a callable `reset(**row)`, called with the rollout's dataset
row before generation; text it returns is appended to the prompt's last user message. Its other public methods
(not starting with "_") are its tools (grpo_fast.rollout.tools.Tool: type hints and a Google-style docstring). An
optional `get_reward()` scores the finished rollout from the environment's state (the `environment_reward`
reward, weight 1). A `{name: factory}` mapping lets one run mix environments: each row then names its own in its
`environment` column, and its prompt shows only that environment's tools.

Instances are pooled per environment and reused from step to step (constructed once, reset every rollout), as
TRL does: a rollout holds its instance from `acquire` until `release`, and the pool grows to the most instances of
one environment held at once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from grpo_fast.rollout.tools import Tool

NOT_TOOLS = ("reset", "get_reward", "close")


def environment_tools(instance: object) -> list[Tool]:
    """The tools of an environment instance: its public methods other than reset, get_reward and close, bound."""
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
        """Returns instances to the pool, for later rollouts to reuse."""
        self._held -= {id(e) for e in instances}

    def has_reward(self) -> bool:
        return any(callable(getattr(pool[0], "get_reward", None)) for pool in self._pool.values())

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

"""The rollout contract: a step's completions come from a scheduler (rollout.mode: how a step gets its groups)
driving a rollout kind (what one rollout is: single turn, multi-turn with tools and environments, a user's
rollout_func) on an engine (what samples the tokens: any registered RolloutEngine, plug-ins included). Each piece
declares what it can take part in (`Capabilities`); `check_plan` refuses every combination that cannot run before
the run starts, with a message naming the piece that cannot do its part and why.

What each scheduler asks of the other two:

| scheduler | rollouts continued over rounds | engine in a process of its own |
|---|---|---|
| sync | no | no |
| partial | yes: a rollout grows a few tokens a round and carries over between steps | no |
| async | yes | yes: built there from the model directory, kind included |
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Scheduler:
    """How a step gets its complete groups (rollout.mode `name`): `rounds`, its rollouts advance a few tokens a round
    and carry over between steps (so tokens may come from older weights: the stale-token corrections apply);
    `engine_process`, they are generated in an engine process of its own, while the trainer trains."""

    name: str
    rounds: bool
    engine_process: bool


SCHEDULERS = {
    "sync": Scheduler("sync", rounds=False, engine_process=False),
    "partial": Scheduler("partial", rounds=True, engine_process=False),
    "async": Scheduler("async", rounds=True, engine_process=True),
}


@dataclass(frozen=True)
class Capabilities:
    """What a rollout kind or an engine can take part in: `rounds`, being continued from its prompt and tokens so
    far, a few tokens at a time; `engine_process`, being rebuilt and run in an engine process of its own (from plain
    data: names and import paths); `lockstep_engine` (a kind), running on an engine whose generate is a collective
    of several ranks; `every_rank` (a kind), running the same rollouts on every rank (partial under torchrun, where
    every rank holds the same pool). `name` says which piece it is and `limits` why it cannot do what it cannot, for
    the refusals."""

    name: str
    rounds: bool = True
    engine_process: bool = True
    lockstep_engine: bool = True
    every_rank: bool = True
    limits: str = ""


def check_plan(
    scheduler: Scheduler,
    kind: Capabilities,
    engine: Capabilities | None = None,
    *,
    lockstep: bool = False,
    world_size: int = 1,
) -> None:
    """ValueError naming the piece of (scheduler, rollout kind, engine) that cannot do its part; `engine` None: not
    known yet (rollout.engine auto picks a built-in, which can do all); `lockstep`: the engine built is one;
    `world_size`: the ranks of the run."""
    why = f" ({kind.limits})" if kind.limits else ""
    mode = f"rollout.mode {scheduler.name}"
    if scheduler.rounds and not kind.rounds:
        raise ValueError(
            f"{mode}: {kind.name} cannot be continued over rounds of a few tokens{why}; use rollout.mode sync"
        )
    if scheduler.engine_process and not kind.engine_process:
        raise ValueError(
            f"{mode}: {kind.name} cannot run in the engine process{why}; use rollout.mode partial (the same rounds "
            "in the trainer's process) or sync"
        )
    if scheduler.engine_process and engine is not None and not engine.engine_process:
        limits = f" ({engine.limits})" if engine.limits else ""
        raise ValueError(
            f"{mode}: {engine.name} cannot be built in an engine process of its own{limits}; use rollout.mode "
            "partial or sync, or an engine that can (hf, vllm)"
        )
    if scheduler.rounds and not scheduler.engine_process and world_size > 1 and not kind.every_rank:
        raise ValueError(
            f"{mode} under torchrun: {kind.name} cannot run on every rank, as every rank holds the same pool{why}; "
            "use one process, or rollout.mode sync or async"
        )
    if lockstep and not kind.lockstep_engine:
        raise ValueError(
            f"rollout: {kind.name} needs an engine each rank calls on its own{why}; the engine generates in "
            "lockstep over ranks (tensor parallelism across ranks)"
        )


def import_path(obj) -> str | None:
    """ "module:qualname" that imports `obj` itself (how an engine process rebuilds it), or None: a lambda, a local
    function or class, an instance."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        return None
    target = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part, None)
    return f"{module}:{qualname}" if target is obj else None


def engine_capabilities(name: str, engine_cls) -> Capabilities:
    """The capabilities of engine class `engine_cls`, named `name` in rollout.engine (its class attribute
    `runs_in_engine_process`, and whether an engine process can import it)."""
    label = f"rollout.engine {name!r}"
    if not engine_cls.runs_in_engine_process:
        return Capabilities(label, engine_process=False, limits=f"{engine_cls.__name__}.runs_in_engine_process")
    if import_path(engine_cls) is None:
        return Capabilities(label, engine_process=False, limits=f"{engine_cls!r} cannot be imported by path")
    return Capabilities(label)

"""Calling a reward function with dataset columns by name (TRL's reward convention).

A reward function is `fn(prompts, completions, **columns) -> list[float | None]`: each dataset column
it names as a parameter arrives as a list with one value per completion. `call_reward` passes the
columns the function asks for and fails early, naming the column, when one is missing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpo_fast.rewards.outcomes import ProgramFailure

RewardFunc = Callable[..., list]


@dataclass(frozen=True)
class TrainerState:
    """What the trainer passes reward functions as `trainer_state` (the fields of transformers'
    TrainerState that reward functions read: a curriculum on the step, say)."""

    global_step: int
    max_steps: int


_POSITIONAL = ("prompts", "completions")


def required_columns(fn: RewardFunc) -> list[str]:
    """Names of the dataset columns `fn` needs: its parameters other than prompts/completions that have
    no default value (keyword-only included; *args / **kwargs excluded)."""
    names = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in _POSITIONAL:
            continue
        if p.default is p.empty:
            names.append(p.name)
    return names


def select_columns(fn: RewardFunc, columns: Mapping[str, Any]) -> dict[str, Any]:
    """The columns (or other keyword arguments) to pass to `fn`: all of them when it takes **kwargs (TRL
    passes every column), else only those it names. Raises KeyError naming the function and the missing
    column."""
    missing = [name for name in required_columns(fn) if name not in columns]
    if missing:
        raise KeyError(
            f"reward function {reward_name(fn)!r} needs dataset column(s) {missing}; "
            f"available columns: {sorted(columns)}"
        )
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(columns)
    return {k: v for k, v in columns.items() if k in params and k not in _POSITIONAL}


def call_reward(
    fn: RewardFunc,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: Mapping[str, Sequence[Any]],
    call_kwargs: Mapping[str, Any] | None = None,
) -> list[float | None]:
    """`fn(prompts, completions, **columns and call_kwargs it takes)`, checked: one reward (float or None) per
    completion (a ProgramFailure stays one: it is a float). columns hold one value per completion;
    call_kwargs are passed as they are (TRL's `trainer_state`)."""
    rewards = fn(prompts, completions, **select_columns(fn, {**(call_kwargs or {}), **columns}))
    if len(rewards) != len(completions):
        raise ValueError(
            f"reward function {reward_name(fn)!r} returned {len(rewards)} rewards for {len(completions)} completions"
        )
    return [None if r is None else r if isinstance(r, ProgramFailure) else float(r) for r in rewards]


def reward_name(fn: RewardFunc) -> str:
    """A readable name for logs: the function's __name__, or its class / partial target."""
    inner = getattr(fn, "func", fn)
    return getattr(inner, "__name__", type(inner).__name__)

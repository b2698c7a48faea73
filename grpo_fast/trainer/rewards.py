"""Reward-function resolution: callables, built-in names, or "package.module:function" strings."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from grpo_fast.data.tasks import countdown_reward, exact_match_reward

BUILTIN_REWARDS: dict[str, Callable] = {"exact_match": exact_match_reward, "countdown": countdown_reward}


def resolve_reward(spec) -> Callable:
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"reward function: expected a callable or a name, got {spec!r}")
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    if ":" in spec:
        module, _, attr = spec.partition(":")
        fn = getattr(importlib.import_module(module), attr, None)
        if callable(fn):
            return fn
    raise ValueError(f"unknown reward function {spec!r}: use {sorted(BUILTIN_REWARDS)} or 'package.module:function'")


def reward_name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)

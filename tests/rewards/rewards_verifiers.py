"""Misbehaving verifiers for the reward-pool tests (module level, so spawn workers can unpickle them)."""

from __future__ import annotations

import ctypes
import os
import time


def constant(prompts, completions, **_):
    """Reward 1.0 for every completion."""
    return [1.0] * len(completions)


def hang_on_hang(prompts, completions, **_):
    """Sleeps forever on the completion "hang", else rewards 1.0."""
    if completions[0] == "hang":
        time.sleep(3600)
    return [1.0]


def segfault_on_crash(prompts, completions, **_):
    """Dereferences NULL on "crash", calls os.abort on "abort", raises on "raise", else rewards 0.5."""
    if completions[0] == "crash":
        ctypes.string_at(0)
    if completions[0] == "abort":
        os.abort()
    if completions[0] == "raise":
        raise RuntimeError("verifier bug")
    return [0.5]


def needs_difficulty(prompts, completions, difficulty, **_):
    """Echoes the `difficulty` column as the reward."""
    return [float(d) for d in difficulty]


def infrastructure_on_down(prompts, completions, **_):
    """Raises InfrastructureError on "down" (a service it needs is gone), else rewards 1.0."""
    from grpo_fast.rewards.outcomes import InfrastructureError

    if completions[0] == "down":
        raise InfrastructureError("service down")
    return [1.0]


def time_left_of_the_item(prompts, completions, **_):
    """Rewards the seconds the pool says this item has left."""
    from grpo_fast.rewards.pool import time_left

    return [time_left()]

"""Built-in tools (registered in grpo_fast.rollout.rollouts.TOOLS)."""

from __future__ import annotations


def multiply(a: int, b: int) -> int:
    """Multiplies two integers exactly.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b

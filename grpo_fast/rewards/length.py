"""Length rewards: DAPO's soft overlong punishment and a plain length penalty.

Length unit: tokens when the trainer passes `completion_ids` (TRL does) or the caller passes
`completion_lengths` or a `tokenizer` (anything with `encode(text) -> list`), else characters of the
completion text. Limits must be given in the same unit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from grpo_fast.rewards.registry import reward
from grpo_fast.rewards.self_test import Sample
from grpo_fast.rewards.text import completion_texts


def completion_lengths_of(
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]] | None = None,
    completion_lengths: Sequence[int] | None = None,
    tokenizer: Any = None,
) -> list[int]:
    """Length of each completion: given lengths, else token-id counts, else tokenizer tokens, else characters."""
    n = len(completions)
    if completion_lengths is not None:
        lengths = [int(x) for x in completion_lengths]
    elif completion_ids is not None:
        lengths = [len(ids) for ids in completion_ids]
    elif tokenizer is not None:
        lengths = [len(tokenizer.encode(t)) for t in completion_texts(completions)]
    else:
        lengths = [len(t) for t in completion_texts(completions)]
    if len(lengths) != n:
        raise ValueError(f"completion lengths: {len(lengths)} values for {n} completions")
    return lengths


_HUGE = list(range(1_000_000))  # far past any completion budget
LENGTH_SAMPLES = (
    Sample("one token", "x", {"completion_ids": [1]}, True),
    Sample("a million tokens", "x", {"completion_ids": _HUGE}, False),
)
"""Both length rewards' self-test: the shortest completion must score above the longest."""


@reward(
    "overlong_penalty",
    kind="length",
    range=lambda options: (-float(options.get("penalty_factor", 1.0)), 0.0),
    samples=LENGTH_SAMPLES,
)
def overlong_penalty(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    *,
    max_completion_length: int,
    overlong_buffer: int,
    completion_ids: Sequence[Sequence[int]] | None = None,
    completion_lengths: Sequence[int] | None = None,
    tokenizer: Any = None,
    penalty_factor: float = 1.0,
    **_: Any,
) -> list[float]:
    """DAPO soft overlong punishment: 0 up to `max_completion_length - overlong_buffer`, then falling
    linearly to `-penalty_factor` at `max_completion_length`, and `-penalty_factor` beyond.

    Bind the limits with functools.partial (the trainer calls `fn(prompts, completions, **columns)`).
    """
    if max_completion_length <= 0:
        raise ValueError(f"max_completion_length: must be > 0, got {max_completion_length}")
    if not 0 < overlong_buffer <= max_completion_length:
        raise ValueError(f"overlong_buffer: must lie in (0, max_completion_length], got {overlong_buffer}")
    lengths = completion_lengths_of(completions, completion_ids, completion_lengths, tokenizer)
    return [soft_overlong_penalty(n, max_completion_length, overlong_buffer, penalty_factor) for n in lengths]


def soft_overlong_penalty(length: int, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO's penalty of one completion: 0 up to max_length - buffer, then linear down to -factor at
    max_length (and beyond); buffer > 0."""
    return -factor * min(max(length - (max_length - buffer), 0) / buffer, 1.0)


@reward(
    "length_penalty",
    kind="length",
    range=(-math.inf, 0.0),
    samples=LENGTH_SAMPLES,
)
def length_penalty(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    *,
    target_length: int,
    scale: float = 1.0,
    completion_ids: Sequence[Sequence[int]] | None = None,
    completion_lengths: Sequence[int] | None = None,
    tokenizer: Any = None,
    **_: Any,
) -> list[float]:
    """Plain length penalty: `-scale * max(0, length - target_length) / target_length`, unbounded below
    (scale it to the other rewards)."""
    if target_length <= 0:
        raise ValueError(f"target_length: must be > 0, got {target_length}")
    lengths = completion_lengths_of(completions, completion_ids, completion_lengths, tokenizer)
    return [-scale * max(0, length - target_length) / target_length for length in lengths]

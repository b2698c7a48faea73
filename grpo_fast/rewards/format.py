"""Format reward: the completion follows the think-then-answer template.

Default template (DeepSeek-R1): optional whitespace, `<think>...</think>`, then a non-empty answer
(anything after the closing tag), with exactly one think block and no think tag in the answer.
Both regexes are configurable.
The reward is a small bounded bonus: `bonus` (default 0.2, at most a fifth of a 1.0 accuracy reward)
when the template matches, else 0.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from grpo_fast.rewards.registry import reward
from grpo_fast.rewards.self_test import Sample
from grpo_fast.rewards.text import completion_texts

THINK_ANSWER = r"^\s*<think>(?:(?!</?think>).)*</think>\s*(?=\S)(?:(?!</?think>).)+$"
MAX_FORMAT_BONUS = 0.2


@reward(
    "think_format",
    kind="format",
    range=lambda options: (0.0, float(options.get("bonus", MAX_FORMAT_BONUS))),
    samples=(
        Sample("think then answer", "<think>2 + 2 is 4.</think> \\boxed{4}", {}, True),
        Sample("no reasoning block", "\\boxed{4}", {}, False),
    ),
)
def think_format(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    *,
    template: str = THINK_ANSWER,
    answer_pattern: str | None = None,
    bonus: float = MAX_FORMAT_BONUS,
    **_: Any,
) -> list[float]:
    """`bonus` per completion whose whole text matches `template` (re.DOTALL) and, if given, contains a
    match of `answer_pattern` after the last `</think>` (e.g. r"<answer>.+</answer>" or r"\\\\boxed\\{");
    else 0.0. `bonus` must lie in [0, 0.2]."""
    if not 0.0 <= bonus <= MAX_FORMAT_BONUS:
        raise ValueError(f"bonus: must lie in [0, {MAX_FORMAT_BONUS}], got {bonus}")
    whole = re.compile(template, re.DOTALL)
    after = re.compile(answer_pattern, re.DOTALL) if answer_pattern else None
    rewards = []
    for text in completion_texts(completions):
        ok = whole.fullmatch(text) is not None
        if ok and after is not None:
            ok = after.search(text.rpartition("</think>")[2]) is not None
        rewards.append(bonus if ok else 0.0)
    return rewards

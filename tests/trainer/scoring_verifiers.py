"""Reward functions for the trainer's scoring tests (module level, so that pool workers can unpickle them).
Each returns a value that shows what it was given."""

from __future__ import annotations

import json
import os
import re
import time

from grpo_fast.rewards.text import completion_text


def completion_length(prompts, completions, completion_ids, **_):
    """The number of token ids it received per completion."""
    return [float(len(ids)) for ids in completion_ids]


def slow_length(prompts, completions, completion_ids, **_):
    """completion_length after 5 ms per completion: more than a cheap function costs (is_cheap)."""
    time.sleep(0.005 * len(completions))
    return [float(len(ids)) for ids in completion_ids]


def nesting_depth(prompts, completions, **_):
    """The nesting depth of each completion's JSON, by a recursive walk (a verifier with the recursion bug of a
    recursive-descent parser: a completion nested deeply enough raises RecursionError); raises ValueError on text that
    is not JSON."""

    def depth(value) -> int:
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        return 1 + max(map(depth, children), default=0)

    return [float(depth(json.loads(completion_text(c)))) for c in completions]


def global_step(prompts, completions, trainer_state, **_):
    """trainer_state.global_step, passed as it is (not one per completion)."""
    return [float(trainer_state.global_step)] * len(completions)


def chat_shaped(prompts, completions, **_):
    """1.0 for a completion given as [{"role": "assistant", "content": ...}], 0.0 for plain text."""
    return [float(isinstance(c, list) and c[0]["role"] == "assistant") for c in completions]


def column_value(prompts, completions, difficulty, **_):
    """The dataset column `difficulty` of each completion's row."""
    return [float(d) for d in difficulty]


def misbehaving(prompts, completions, **_):
    """Hangs on "hang", kills its process on "crash", raises on "raise", else rewards 1.0 (per completion: cheap, it
    may be moved in-process and called on a whole batch)."""
    for completion in completions:
        text = completion if isinstance(completion, str) else completion[0]["content"]
        if text == "hang":
            time.sleep(3600)
        if text == "crash":
            os._exit(3)
        if text == "raise":
            raise RuntimeError("verifier bug")
    return [1.0] * len(completions)


def global_step_slowly(prompts, completions, trainer_state, **_):
    """global_step after 0.1 s per completion: never cheap (is_cheap), so it stays in the pool."""
    time.sleep(0.1 * len(completions))
    return [float(trainer_state.global_step)] * len(completions)


def flat_on_even_operands(prompts, completions, **_):
    """1.0 for every completion of a prompt "(a?b)%10=" with an even a (a zero-variance group), else a value that
    varies with the completion's characters."""
    varied = [sum(map(ord, completion_text(c))) % 7 / 6 for c in completions]
    return [1.0 if even_operand(p) else r for p, r in zip(prompts, varied, strict=True)]


def even_operand(prompt: str) -> bool:
    return int(re.match(r"\((\d+)", prompt).group(1)) % 2 == 0


def logs_a_metric(prompts, completions, log_metric, **_):
    """completion count as a metric through TRL's log_metric; 0 per completion."""
    log_metric("completions", len(completions))
    return [0.0] * len(completions)

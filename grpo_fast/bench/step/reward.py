"""The reward: trivial, identical for every contender, and counting what it sees (the completions per step in the
results are measured in each contender's process)."""

from __future__ import annotations

from grpo_fast.rewards.text import completion_text

REWARD_SPEC = "grpo_fast.bench.step.reward:counting_reward"
"""How both trainers name the reward (an import path: our reward pool imports it in its workers)."""

SEEN: dict = {"calls": 0, "lengths": []}


def reset_seen() -> None:
    SEEN["calls"] = 0
    SEEN["lengths"] = []


def counting_reward(prompts, completions, completion_ids=None, answer=None, **_) -> list[float]:
    """Exact match against the `answer` column when the rows have one (tiny), else the completion's length
    / 100. Records every completion's token count in SEEN (this process's count of completions scored)."""
    lengths = [len(ids) for ids in completion_ids] if completion_ids is not None else [0] * len(completions)
    SEEN["calls"] += 1
    SEEN["lengths"].extend(lengths)
    if answer is not None:
        return [float(completion_text(c).strip() == str(a).strip()) for c, a in zip(completions, answer, strict=True)]
    return [n / 100.0 for n in lengths]


def seen_stats() -> dict:
    lengths = SEEN["lengths"]
    return {
        "completions": len(lengths),
        "completion_tokens": sum(lengths),
        "completion_length_min": min(lengths, default=0),
        "completion_length_max": max(lengths, default=0),
        "reward_calls": SEEN["calls"],
    }

"""Completions to the reward functions: a multi-turn completion is scored on its conversation (what TRL passes as
the completion of a chat prompt), with its environment's reward as the `environment_reward` column and its
environment instance for the functions that take `environments`."""

from __future__ import annotations

from collections.abc import Mapping

from grpo_fast.rewards.reward_set import PendingScores, RewardSet, TrainerState
from grpo_fast.rollout.base import Completion


def submit_completions(
    rewards: RewardSet,
    rows: list[dict],
    completions: list[Completion],
    state: TrainerState,
    columns: Mapping[str, list] | None = None,
) -> PendingScores:
    """Start scoring completions[i] of dataset row rows[i] (`columns`: extra per-completion columns)."""
    episodes = [c.episode for c in completions]
    kwargs = {}
    if any(e is not None for e in episodes):
        columns = {**(columns or {}), "environment_reward": [e and e.environment_reward for e in episodes]}
        kwargs["conversations"] = [e and e.messages for e in episodes]
        if any(e is not None and e.environment is not None for e in episodes):
            kwargs["environments"] = [e and e.environment for e in episodes]
    texts, ids = [c.text for c in completions], [c.token_ids for c in completions]
    return rewards.submit(rows, texts, ids, state, columns=columns, **kwargs)

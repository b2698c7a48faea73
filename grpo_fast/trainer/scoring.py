"""The run's reward functions: resolved from their specs, scored per completion, combined with weights."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from grpo_fast.rewards.columns import reward_name
from grpo_fast.rewards.registry import reward_from_spec
from grpo_fast.trainer.advantages import combine_rewards


class RewardSet:
    """Reward functions (specs of grpo_fast.rewards.registry) with one weight each (default 1) and a
    distinct metric name each (the function's name, suffixed when two share it)."""

    def __init__(self, specs: Sequence, weights: Sequence[float] | None = None) -> None:
        self.funcs = [reward_from_spec(s) for s in specs]
        self.weights = list(weights) if weights is not None else [1.0] * len(self.funcs)
        if len(self.weights) != len(self.funcs):
            raise ValueError(f"reward.weights: {len(self.weights)} weights for {len(self.funcs)} reward functions")
        self.names: list[str] = []
        for fn in self.funcs:
            name = reward_name(fn)
            self.names.append(name if name not in self.names else f"{name}_{len(self.names)}")

    @property
    def full_reward(self) -> float:
        """The combined reward of a completion every function scores 1."""
        return float(sum(self.weights))

    def score(self, rows: list[dict], completions: list[str]) -> torch.Tensor:
        """[N, F] rewards (NaN where a function returned None) for rows[i] / completions[i]; every dataset
        column but the prompt goes to the functions by name (TRL's convention)."""
        prompts = [r["prompt"] for r in rows]
        columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"} if rows else {}
        out = torch.full((len(rows), len(self.funcs)), math.nan)
        for j, (fn, name) in enumerate(zip(self.funcs, self.names, strict=True)):
            values = fn(prompts=prompts, completions=completions, **columns)
            if len(values) != len(rows):
                raise ValueError(f"reward function {name} returned {len(values)} values for {len(rows)} completions")
            out[:, j] = torch.tensor([math.nan if v is None else float(v) for v in values])
        return out

    def combine(self, per_func: torch.Tensor) -> torch.Tensor:
        """[N, F] -> [N] weighted sum (see advantages.combine_rewards)."""
        return combine_rewards(per_func, self.weights)

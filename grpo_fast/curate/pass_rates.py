"""K sampled completions per prompt, scored by a run's reward functions: the per-prompt pass rate that
rejection sampling, pass-rate filtering, the online curriculum and the pre-flight difficulty probe read.

A completion is *correct* when its combined reward reaches the full reward of its row (every reward
function that applies to the row scores it 1, weighted): the verifiers agree it solved the task.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_fast.core.scoring import submit_completions
from grpo_fast.rewards.columns import TrainerState
from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec
from grpo_fast.rollout.generation import Rollouts

CORRECT_TOLERANCE = 1e-6


@dataclass(frozen=True)
class PromptSamples:
    """The K completions of one prompt. row: index of the dataset row; per_func [K, F] rewards of each
    function (NaN: not scored); rewards [K] combined; correct [K] bool."""

    row: int
    completions: list[Completion]
    per_func: torch.Tensor
    rewards: torch.Tensor
    correct: torch.Tensor

    @property
    def pass_rate(self) -> float:
        return float(self.correct.float().mean())


def sample_prompts(
    engine: RolloutEngine,
    rollouts: Rollouts,
    rows: list[dict],
    index: list[int],
    rewards,
    sampling: SamplingSpec,
    state: TrainerState,
) -> list[PromptSamples]:
    """`sampling.n` completions for each rows[i], i in `index`, produced by `rollouts` (one engine call, or
    multi-turn with tools) and scored by the RewardSet `rewards`; one PromptSamples per prompt, in `index` order."""
    k = sampling.n
    flat_rows = [rows[i] for i in index for _ in range(k)]
    out = rollouts.generate(engine, [rows[i] for i in index], sampling, index)
    flat = out.completions
    scored = submit_completions(rewards, flat_rows, flat, state, out.columns).result()
    combined = rewards.combine(scored.per_func)
    correct = combined >= rewards.full_rewards(flat_rows) - CORRECT_TOLERANCE  # NaN (unscored) is not correct
    out = []
    for j, i in enumerate(index):
        group = slice(j * k, (j + 1) * k)
        out.append(PromptSamples(i, flat[group], scored.per_func[group], combined[group], correct[group]))
    return out


def in_band(pass_rate: float, low: float, high: float) -> bool:
    """low <= pass_rate <= high (inclusive: with K samples the rates are multiples of 1/K)."""
    return low - 1e-9 <= pass_rate <= high + 1e-9

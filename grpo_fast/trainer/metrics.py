"""What a GRPO step logs (`step_metrics`); grpo_fast.core.metrics writes it."""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from grpo_fast.rewards.reward_set import FAILURE_KINDS
from grpo_fast.trainer.advantages import reward_stats
from grpo_fast.trainer.health import reward_by_length
from grpo_fast.trainer.staleness import staleness_metrics

logger = logging.getLogger(__name__)


def step_metrics(rollout, reward_names: list[str], times: dict[str, float]) -> dict[str, float]:
    """The rollout side of a step's metrics: rewards (overall and per function, with each verifier's
    failures), zero-variance groups, completion lengths and truncation over every completion generated this
    step, throughput, the trained completions' staleness (grpo_fast.trainer.staleness) and, with partial
    rollouts, the step's rounds, restarts and drops.

    rollout: the step's RolloutBatch; times: seconds of "train", "sync" and the whole "step" (generation and
    scoring times come from the rollout: time/score is scoring on the critical path, time/score_pool the
    reward pool's own time, mostly overlapped with generation); the loss step's metrics come from the caller."""
    lengths = torch.tensor([len(c.token_ids) for c in rollout.generated], dtype=torch.float32)
    mean, std = reward_stats(rollout.generated_rewards)
    out = {
        "reward/mean": mean,
        "reward/std": std,
        "frac_zero_var_groups": rollout.frac_zero_var_groups,
        "frac_stuck_groups": rollout.frac_stuck_groups,
        "resample_rounds": rollout.resample_rounds,
        "completion/length_mean": float(lengths.mean()),
        "completion/length_p95": float(torch.quantile(lengths, 0.95)),
        "completion/truncated_frac": float(np.mean([c.truncated for c in rollout.generated])),
        "completion/reward_by_length_quartile": reward_by_length(
            [len(c.token_ids) for c in rollout.generated], rollout.generated_rewards.tolist()
        ),
    }
    for j, name in enumerate(reward_names):
        col = rollout.generated_rewards_per_func[:, j]
        col = col[~torch.isnan(col)]
        out[f"reward/{name}/mean"] = float(col.mean()) if col.numel() else math.nan
        out[f"reward/{name}/std"] = float(col.std()) if col.numel() > 1 else 0.0
        for kind in FAILURE_KINDS:
            out[f"reward/{name}/{kind}"] = float(rollout.reward_failures.get(f"{name}/{kind}", 0))
    out.update(
        {
            "time/generate": rollout.time_generate,
            "time/score": rollout.time_score,
            "time/score_pool": rollout.time_score_pool,
            "time/train": times["train"],
            "time/sync": times["sync"],
            "time/step": times["step"],
            "tokens_per_second/generate": float(lengths.sum()) / max(rollout.time_generate, 1e-9),
        }
    )
    out["rollout/trained_samples"] = float(len(rollout.completions))
    out["rollout/trained_tokens"] = float(sum(len(c.token_ids) for c in rollout.completions))
    out.update(staleness_metrics(rollout.completions, rollout.version))
    out.update({f"rollout/{k}": float(v) for k, v in rollout.partial_counts.items()})
    return out

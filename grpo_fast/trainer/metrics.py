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
    failures), zero-variance groups, completion lengths (the tokens the engine sampled, never a tool's result) and
    truncation over every completion generated this step, throughput, the trained completions' staleness
    (grpo_fast.trainer.staleness), with partial rollouts the step's rounds, restarts and drops, and with tools
    `tool_metrics`.

    rollout: the step's RolloutBatch; times: seconds of "train", "sync" and the whole "step" (generation and
    scoring times come from the rollout: time/score is scoring on the critical path, time/score_pool the
    reward pool's own time, mostly overlapped with generation); the loss step's metrics come from the caller."""
    lengths = torch.tensor([c.num_sampled for c in rollout.generated], dtype=torch.float32)
    mean, std = reward_stats(rollout.generated_rewards)
    out = {
        "reward/mean": mean,
        "reward/std": std,
        "frac_zero_var_groups": rollout.frac_zero_var_groups,
        "frac_stuck_groups": rollout.frac_stuck_groups,
        "resample_rounds": rollout.resample_rounds,
        "rollout/generated_samples": float(len(rollout.generated)),
        "completion/length_mean": float(lengths.mean()),
        "completion/length_p95": float(torch.quantile(lengths, 0.95)),
        "completion/truncated_frac": float(np.mean([c.truncated for c in rollout.generated])),
        "completion/reward_by_length_quartile": reward_by_length(
            [c.num_sampled for c in rollout.generated], rollout.generated_rewards.tolist()
        ),
    }
    for j, name in enumerate(reward_names):
        col = rollout.generated_rewards_per_func[:, j]
        col = col[~torch.isnan(col)]
        out[f"reward/{name}/mean"] = float(col.mean()) if col.numel() else math.nan
        out[f"reward/{name}/std"] = float(col.std()) if col.numel() > 1 else 0.0
        for kind in FAILURE_KINDS:
            out[f"reward/{name}/{kind}"] = float(rollout.reward_failures.get(f"{name}/{kind}", 0))
    out.update({f"reward_log/{name}": sum(values) / len(values) for name, values in rollout.reward_logs.items()})
    out.update(
        {
            "time/generate": rollout.time_generate,
            "time/score": rollout.time_score,
            "time/score_pool": rollout.time_score_pool,
            "time/train": times["train"],
            "time/sync": times["sync"],
            "time/step": times["step"],
        }
    )
    tokens = float(lengths.sum()) if rollout.tokens_generated is None else rollout.tokens_generated
    seconds = rollout.time_generate if rollout.seconds_generating is None else rollout.seconds_generating
    out["tokens_per_second/generate"] = tokens / max(seconds, 1e-9)
    out["rollout/trained_samples"] = float(len(rollout.completions))
    out["rollout/trained_tokens"] = float(sum(c.num_sampled for c in rollout.completions))
    out.update(tool_metrics(rollout.generated, rollout.time_tools))
    out.update(staleness_metrics(rollout.completions, rollout.version))
    out.update({f"rollout/{k}": float(v) for k, v in rollout.partial_counts.items()})
    return out


def tool_metrics(completions, seconds: float) -> dict[str, float]:
    """Multi-turn rollouts' metrics (none for single-turn completions): tool calls, assistant turns per rollout,
    failed calls per rollout by tool, the share of the completions' tokens inserted (masked out of the loss), the
    step's seconds in tools (wall clock, `seconds`) and a call's mean seconds."""
    episodes = [c.episode for c in completions if c.episode is not None]
    if not episodes:
        return {}
    n, calls = len(episodes), sum(e.calls for e in episodes)
    tokens = sum(len(c.token_ids) for c in completions)
    out = {
        "tools/calls_per_rollout": calls / n,
        "tools/rollouts_calling_frac": sum(e.calls > 0 for e in episodes) / n,
        "tools/turns_per_rollout": sum(e.turns for e in episodes) / n,
        "tools/failures_per_rollout": sum(sum(e.failures.values()) for e in episodes) / n,
        "tools/masked_token_frac": sum(len(c.token_ids) - c.num_sampled for c in completions) / max(tokens, 1),
        "tools/call_seconds_mean": sum(e.tool_seconds for e in episodes) / max(calls, 1),
        "time/tools": seconds,
    }
    for name in sorted({k for e in episodes for k in e.failures}):
        out[f"tools/{name}/failures"] = float(sum(e.failures.get(name, 0) for e in episodes))
    return out

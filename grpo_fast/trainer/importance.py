"""Rollout correction: importance weights of the trainer's old policy against the engine that sampled.

TRL 1.16 computes them in `GRPOTrainer._generate_and_score_completions` (its `vllm_importance_sampling_*`
options) and hands them to `_compute_loss` as `importance_sampling_ratio`; here the loss step computes them
once per step from the recomputed old logprobs and the engine's sampling logprobs, and passes them to the
loss as `is_weights` (per token [B, T], or one per sequence [B]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def rollout_importance_weights(
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """old / engine logprobs and mask [B, T] -> weights [B, T] (token_*) or [B] (sequence_*):
    r = exp(Σ or per token of m (old − sampling)), NaN differences counted as 0 (a token the engine could
    not score is not corrected); *_truncate clamps r to [clip_min, clip_max], *_mask sets r = 0 outside it
    (None: no bound on that side). Per-token weights are 1 at padding (exp 0), as TRL's."""
    if mode not in MODES:
        raise ValueError(f"vllm_importance_sampling_mode: expected one of {MODES}, got {mode!r}")
    diff = torch.nan_to_num((old_logprobs - sampling_logprobs) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


@dataclass(frozen=True)
class Correction:
    """What a step does about the policy that sampled its tokens: `old_from_rollout`, the behaviour logprobs are
    the PPO ratio's old policy; `weights`, (mode, clip_min, clip_max) of the importance weights against them;
    `mask_staleness`, tokens more versions old than this get no loss (None: none masked)."""

    old_from_rollout: bool = False
    weights: tuple[str, float | None, float | None] | None = None
    mask_staleness: int | None = None


def step_correction(config) -> Correction:
    """The correction of a run (its TrainConfig): grpo.old_logprobs and grpo.vllm_importance_sampling_*, and with
    rollout.mode partial or async its rollout.partial.correction (grpo.vllm_importance_sampling_correction, when
    on, is the decoupled correction with its own mode and bounds):

    decoupled  weights min(π_prox / π_behaviour, clip_max) per token, the ratio against π_prox (the trainer's weights
               before the update): tokens of any age, each corrected once; π_prox costs a forward pass only with
               num_iterations > 1 or dropout (else the update's own forward gives it: loss_step `drops_out`);
    coupled    the ratio against π_behaviour: no extra forward, but a stale token's policy change is clipped as if
               the update had made it, so old tokens mostly fall outside the clip range and give no gradient;
    mask       tokens more than mask_staleness versions old give no loss: unbiased for the rest, their samples lost;
    none       stale tokens trained as if on-policy (biased, for comparison)."""
    g, r = config.grpo, config.rollout
    chosen = r.partial.correction if r.scheduler.rounds else "none"
    weights = g.rollout_correction()
    if chosen == "decoupled" and weights is None:
        weights = ("token_truncate", None, g.vllm_importance_sampling_clip_max)
    return Correction(
        old_from_rollout=g.old_logprobs == "rollout" or chosen == "coupled",
        weights=weights,
        mask_staleness=r.partial.mask_staleness if chosen == "mask" else None,
    )

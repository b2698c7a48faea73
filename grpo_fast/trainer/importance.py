"""Rollout correction: importance weights of the trainer's old policy against the engine that sampled.

TRL 1.16 computes them in `GRPOTrainer._generate_and_score_completions` (its `vllm_importance_sampling_*`
options) and hands them to `_compute_loss` as `importance_sampling_ratio`; here the loss step computes them
once per step from the recomputed old logprobs and the engine's sampling logprobs, and passes them to the
loss as `is_weights` (per token [B, T], or one per sequence [B]).
"""

from __future__ import annotations

import math

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

"""Rewards -> advantages: weighted sum of reward functions, DAPO's soft overlong penalty, group-mean
baseline with group / batch / no std scaling, and the zero-variance group filter of dynamic sampling."""

from __future__ import annotations

import math

import torch


def combine_rewards(per_func: torch.Tensor, weights: list[float] | None = None) -> torch.Tensor:
    """per_func [N, F] with NaN where a function returned None -> weighted sum [N] (NaN-as-0, TRL's nansum).
    A row where every function returned None gets reward 0."""
    w = torch.ones(per_func.shape[1]) if weights is None else torch.tensor(weights, dtype=torch.float32)
    return torch.nansum(per_func * w, dim=1)


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO soft overlong punishment [N]: 0 up to max_len - buffer, then linear down to -factor at max_len."""
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    start = max_len - buffer
    return -factor * ((lengths.float() - start).clamp(min=0) / buffer).clamp(max=1.0)


def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group", eps: float = 1e-4):
    """rewards [N] laid out as N/G groups of G -> (advantages [N], zero-variance group mask [N/G]).

    advantage = r - mean(group); divided by the group's std ("group"), the whole batch's std ("batch"), or
    not at all ("none", Dr. GRPO). std is the unbiased one (TRL), eps avoids 0/0."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size).float()
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
    adv = grouped - mean
    if scale_rewards == "group":
        adv = adv / (std + eps)
    elif scale_rewards == "batch":
        adv = adv / (rewards.float().std() + eps if rewards.numel() > 1 else 1.0)
    elif scale_rewards != "none":
        raise ValueError(f"scale_rewards: expected 'group', 'batch' or 'none', got {scale_rewards!r}")
    zero_var = (grouped.max(dim=1).values - grouped.min(dim=1).values).abs() < 1e-12
    return adv.reshape(-1), zero_var


def reward_stats(rewards: torch.Tensor) -> tuple[float, float]:
    if rewards.numel() == 0:
        return math.nan, math.nan
    return float(rewards.mean()), float(rewards.std()) if rewards.numel() > 1 else 0.0

"""Rewards -> advantages: group-mean baseline with group / batch / no std scaling, and the zero-variance group
filter of dynamic sampling (grpo_fast.rewards.reward_set combines the reward functions first)."""

from __future__ import annotations

import math

import torch


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Unbiased std ignoring NaNs (TRL's nanstd); NaN where fewer than 2 values."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True)
    var = torch.nansum((x - mean) ** 2, dim=dim, keepdim=True) / (count - 1).clamp(min=1)
    std = torch.where(count > 1, var.sqrt(), torch.full_like(var, math.nan))
    if not keepdim:
        std = std.squeeze() if dim is None else std.squeeze(dim)
    return std


def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group", eps: float = 1e-4):
    """rewards [N] laid out as N/G groups of G -> (advantages [N], zero-variance group mask [N/G]).

    advantage = r - mean(group); divided by the group's std ("group"), the whole batch's std ("batch"), or
    not at all ("none", Dr. GRPO). std is the unbiased one (TRL), eps avoids 0/0. NaN rewards (unscorable
    completions) are left out of means and stds and get advantage 0 (TRL)."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size).float()
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    std = nanstd(grouped, dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
    adv = grouped - mean
    if scale_rewards == "group":
        adv = adv / (std + eps)
    elif scale_rewards == "batch":
        adv = adv / (nanstd(rewards.float()) + eps if rewards.numel() > 1 else 1.0)
    elif scale_rewards != "none":
        raise ValueError(f"scale_rewards: expected 'group', 'batch' or 'none', got {scale_rewards!r}")
    valid = ~torch.isnan(grouped)
    spread = grouped.where(valid, -math.inf).amax(dim=1) - grouped.where(valid, math.inf).amin(dim=1)
    zero_var = ~(spread >= 1e-12)  # an all-NaN group has spread -inf
    return torch.nan_to_num(adv, nan=0.0).reshape(-1), zero_var


def reward_stats(rewards: torch.Tensor) -> tuple[float, float]:
    if rewards.numel() == 0:
        return math.nan, math.nan
    return float(torch.nanmean(rewards)), float(nanstd(rewards)) if rewards.numel() > 1 else 0.0

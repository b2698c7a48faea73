"""The optimizer and learning-rate schedule of an `OptimConfig` (shared by the GRPO and SFT trainers)."""

from __future__ import annotations

import math

import torch


def build_optimizer(model: torch.nn.Module, optim) -> torch.optim.AdamW:
    """AdamW over the model's trainable parameters."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=optim.lr,
        betas=(optim.beta1, optim.beta2),
        eps=optim.eps,
        weight_decay=optim.weight_decay,
    )


def build_scheduler(optimizer, optim, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over `optim.warmup_steps`, then `optim.lr_scheduler` over the remaining steps."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(optim, total_steps))


def lr_lambda(optim, total_steps: int):
    """The lr multiplier of optimizer step `step` (0-based): (step + 1) / warmup during warmup, then
    1 (constant), 1 - p (linear) or (1 + cos(pi p)) / 2 (cosine), p = progress through the steps after warmup."""
    warmup = optim.warmup_steps

    def fn(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if optim.lr_scheduler == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if optim.lr_scheduler == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return fn

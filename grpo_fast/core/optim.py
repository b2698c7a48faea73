"""The optimizer and learning-rate schedule of an `OptimConfig` (shared by the GRPO and SFT trainers)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from grpo_fast.config_fields import ConfigSection, option


@dataclass
class OptimConfig(ConfigSection):
    """AdamW and its learning-rate schedule."""

    key = "optim"
    lr: float = option(1e-5, "peak learning rate", low=0, low_open=True)
    weight_decay: float = option(0.0, "AdamW's decoupled weight decay", low=0)
    beta1: float = option(0.9, "AdamW's beta1", low=0, high=1, high_open=True)
    beta2: float = option(0.99, "AdamW's beta2", low=0, high=1, high_open=True)
    eps: float = option(1e-8, "AdamW's epsilon", low=0, low_open=True)
    lr_scheduler: Literal["constant", "linear", "cosine"] = option("constant", "the schedule after warmup")
    warmup_steps: int = option(0, "optimizer steps of linear warmup from 0", low=0)
    max_grad_norm: float = option(1.0, "gradient clipping norm (0: no clipping, as in transformers)", low=0)

    @property
    def clip_norm(self) -> float:
        """The norm to clip gradients to: max_grad_norm, inf for 0 (no clipping)."""
        return self.max_grad_norm or math.inf


def build_optimizer(model: torch.nn.Module, optim) -> torch.optim.AdamW:
    """AdamW over the model's trainable parameters, in torch's fused implementation (one kernel over every
    parameter: on CPU, where torch's default is a Python loop of ~10 ops per parameter, 29 -> 0.6 ms per step for
    the demo's 0.3M-parameter model and 3.2 -> 0.9 s for a 44M one on 2 cores)."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=optim.lr,
        betas=(optim.beta1, optim.beta2),
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        fused=True,
    )


def build_scheduler(optimizer, optim, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over `optim.warmup_steps`, then `optim.lr_scheduler` over the remaining steps."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(optim, total_steps))


def apply_hyperparameters(optimizer, scheduler, optim) -> None:
    """After a checkpoint's optimizer and scheduler states are loaded (each brings back the lr, weight decay, betas
    and eps it was saved with): the config's again, at the schedule's saved position, so that a resume with another
    `optim.lr` trains with it."""
    for group in optimizer.param_groups:
        group.update(weight_decay=optim.weight_decay, betas=(optim.beta1, optim.beta2), eps=optim.eps)
        group["initial_lr"] = optim.lr
    scheduler.base_lrs = [optim.lr] * len(optimizer.param_groups)
    lrs = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs  # what get_last_lr() reports


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

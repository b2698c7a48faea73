"""Which implementation of layer 2 runs: the backend's fused kernel where it has one and it applies, else the
PyTorch token math (grpo_fast.loss.token_math). Both have the signature of `token_math.grpo_token_loss`.

A backend's kernel (`Capabilities.token_loss_kernel`) knows objectives by plain codes and takes its options as
plain numbers (grpo_fast.kernels.grpo_token_loss.TokenLossOptions); this module is where the loss's options meet
them. It falls back to PyTorch, per call, for what the kernel does not cover:
  * an objective without a kernel code (one a user registered): logged once per objective;
  * row subsets (a chunk), non-fp32 inputs (fp64 gradcheck) and TRL's token masks (top_entropy_quantile,
    off_policy_mask_threshold; O(N) either way): silently, as the kernel is not meant for them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from .layout import TokenLayout
from .loss_types import Objective
from .options import GRPOLossConfig
from .token_math import TokenInputs, TokenLossOutput, grpo_token_loss

logger = logging.getLogger(__name__)

TokenLoss = Callable[..., TokenLossOutput]
"""(logprobs [R], entropy [R] | None, TokenInputs, TokenLayout, GRPOLossConfig, rows) -> TokenLossOutput."""

KERNEL_OBJECTIVE_CODES = {Objective.CLIPPED: 0, Objective.CISPO: 1, Objective.SAPO: 2, Objective.VESPO: 3}
"""Objective -> the layer-2 kernels' code for it (grpo_fast.kernels.grpo_token_loss.KernelObjective)."""
_LOGGED_FALLBACKS: set[Objective] = set()


def select_token_loss(backend, config: GRPOLossConfig) -> TokenLoss:
    """The layer-2 implementation for `config` on `backend`."""
    kernel = backend.capabilities.token_loss_kernel
    if kernel is None:
        return grpo_token_loss
    objective = config.loss_spec.objective
    if objective not in KERNEL_OBJECTIVE_CODES:
        if objective not in _LOGGED_FALLBACKS:
            _LOGGED_FALLBACKS.add(objective)
            logger.info(
                "loss_type %r: objective %r has no %s layer-2 kernel; its token math runs in PyTorch",
                config.loss_type,
                objective.value,
                backend.name,
            )
        return grpo_token_loss
    if config.top_entropy_quantile < 1.0 or config.off_policy_mask_threshold is not None:
        return grpo_token_loss
    return _KernelTokenLoss(kernel)


class _KernelTokenLoss:
    """A plain-number layer-2 kernel behind the `TokenLoss` signature."""

    def __init__(self, kernel: Callable) -> None:
        self.kernel = kernel

    def __call__(
        self,
        logprobs: torch.Tensor,
        entropy: torch.Tensor | None,
        inputs: TokenInputs,
        layout: TokenLayout,
        config: GRPOLossConfig,
        rows: slice = slice(None),
    ) -> TokenLossOutput:
        whole = rows == slice(None) or (rows.start in (None, 0) and rows.stop in (None, layout.num_tokens))
        if not whole or logprobs.dtype != torch.float32 or layout.mask.dtype != torch.float32:
            return grpo_token_loss(logprobs, entropy, inputs, layout, config, rows)
        sums, grad_logp, grad_entropy = self.kernel(
            logprobs.detach(),
            None if entropy is None else entropy.detach(),
            inputs.old_logprobs,
            inputs.ref_logprobs,
            inputs.advantages,
            inputs.is_weights,
            inputs.loss_weights,
            inputs.entropy_weights,
            layout.mask,
            layout.seq_starts,
            kernel_options(config, inputs.is_weights_per_sequence),
        )
        return TokenLossOutput(sums, grad_logp, grad_entropy)


def kernel_options(config: GRPOLossConfig, is_weights_per_sequence: bool = False):
    """The loss options as the layer-2 kernels' plain numbers (TokenLossOptions)."""
    from grpo_fast.kernels.grpo_token_loss import KernelObjective, TokenLossOptions  # triton: imported on use

    return TokenLossOptions(
        objective=KernelObjective(KERNEL_OBJECTIVE_CODES[config.loss_spec.objective]),
        sequence_level=config.importance_sampling_level == "sequence",
        clip_low=config.epsilon_low,
        clip_high=config.clip_high,
        delta=float("inf") if config.delta is None else config.delta,
        beta=config.beta,
        entropy_coef=config.entropy_coef,
        use_bias_correction_kl=config.use_bias_correction_kl,
        sapo_temperature_pos=config.sapo_temperature_pos,
        sapo_temperature_neg=config.sapo_temperature_neg,
        vespo_k_pos=config.vespo_k_pos,
        vespo_lambda_pos=max(config.vespo_lambda_pos, 1e-4),  # TRL floors the rates at 1e-4
        vespo_k_neg=config.vespo_k_neg,
        vespo_lambda_neg=max(config.vespo_lambda_neg, 1e-4),
        is_weights_per_sequence=is_weights_per_sequence,
    )

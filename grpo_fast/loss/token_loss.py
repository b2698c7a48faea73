"""Which implementation of layer 2 runs: the backend's fused kernel where it has one and it applies, else the
PyTorch token math (grpo_fast.loss.token_math). Both have the signature of `token_math.grpo_token_loss`.

A backend's kernel (`Capabilities.token_loss_kernel`) knows objectives by plain codes (an objective declares its
code as `Objective.kernel`) and takes its options as plain numbers (grpo_fast.kernels.grpo_token_loss.
TokenLossOptions); this module is where the loss's options meet them. It falls back to PyTorch, per call, for what
the kernel does not cover:
  * an objective without a kernel code (a trust-region objective, one a user registered): logged once per
    objective;
  * row subsets (a chunk), non-fp32 inputs (fp64 gradcheck) and TRL's token masks (top_entropy_quantile,
    off_policy_mask_threshold; O(N) either way): silently, as the kernel is not meant for them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import torch

from ..backends import get_backend
from .layout import TokenLayout
from .options import GRPOLossConfig
from .token_math import SUM_NAMES, TokenInputs, TokenLossOutput, covers_all, grpo_token_loss

logger = logging.getLogger(__name__)

TokenLoss = Callable[..., TokenLossOutput]
"""(logprobs [R], entropy [R] | None, TokenInputs, TokenLayout, GRPOLossConfig, rows) -> TokenLossOutput."""

_LOGGED_FALLBACKS: set[str] = set()  # objectives whose fallback was logged


def select_token_loss(backend, config: GRPOLossConfig) -> TokenLoss:
    """The layer-2 implementation for `config` on `backend`."""
    kernel = backend.capabilities.token_loss_kernel
    if kernel is None:
        return grpo_token_loss
    objective = config.objective_spec
    if objective.kernel is None:
        if objective.name not in _LOGGED_FALLBACKS:
            _LOGGED_FALLBACKS.add(objective.name)
            logger.info(
                "loss_type %r: objective %r has no %s layer-2 kernel; its token math runs in PyTorch",
                config.loss_type,
                objective.name,
                backend.name,
            )
        return grpo_token_loss
    if config.top_entropy_quantile < 1.0 or config.off_policy_mask_threshold is not None:
        return grpo_token_loss
    return KernelTokenLoss(backend.name)


class KernelTokenLoss:
    """The layer-2 kernel of backend `backend` behind the `TokenLoss` signature (PyTorch where it does not apply),
    and, for torch.compile, as a differentiable op (`differentiable`)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend

    @staticmethod
    def applies(logprobs: torch.Tensor, layout: TokenLayout, rows: slice = slice(None)) -> bool:
        """Whether the kernel takes these rows: all of them, in fp32 (fp64 runs the PyTorch math, e.g. gradcheck)."""
        return covers_all(rows, layout) and logprobs.dtype == torch.float32 and layout.mask.dtype == torch.float32

    def __call__(
        self,
        logprobs: torch.Tensor,
        entropy: torch.Tensor | None,
        inputs: TokenInputs,
        layout: TokenLayout,
        config: GRPOLossConfig,
        rows: slice = slice(None),
    ) -> TokenLossOutput:
        if not self.applies(logprobs, layout, rows):
            return grpo_token_loss(logprobs, entropy, inputs, layout, config, rows)
        sums, grad_logp, grad_entropy = token_loss_kernel_op(
            logprobs.detach(), None if entropy is None else entropy.detach(), *self._arguments(inputs, layout, config)
        )
        return TokenLossOutput(with_masked_sum(sums), grad_logp, grad_entropy if grad_entropy.numel() else None)

    def differentiable(self, logprobs, entropy, inputs: TokenInputs, layout: TokenLayout, config: GRPOLossConfig):
        """(loss [], sums [len(SUM_NAMES)] detached): the kernel's loss, differentiable w.r.t. logprobs and entropy
        through the op's registered autograd."""
        sums, _, _ = token_loss_kernel_op(logprobs, entropy, *self._arguments(inputs, layout, config))
        return sums[0], with_masked_sum(sums.detach())

    def _arguments(self, inputs: TokenInputs, layout: TokenLayout, config: GRPOLossConfig) -> tuple:
        options = kernel_options(config, inputs.is_weights_per_sequence)
        tensors = (inputs.old_logprobs, inputs.ref_logprobs, inputs.advantages, inputs.is_weights)
        tensors += (inputs.loss_weights, inputs.entropy_weights, layout.mask, layout.seq_starts)
        return (*tensors, self.backend, *dataclasses.astuple(options))


@torch.library.custom_op("grpo_fast::token_loss_kernel", mutates_args=())
def token_loss_kernel_op(
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    old_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    is_weights: torch.Tensor | None,
    loss_weights: torch.Tensor,
    entropy_weights: torch.Tensor,
    mask: torch.Tensor,
    seq_starts: torch.Tensor,
    backend: str,
    objective: int,
    sequence_level: bool,
    clip_low: float,
    clip_high: float,
    delta: float,
    beta: float,
    entropy_coef: float,
    use_bias_correction_kl: bool,
    sapo_temperature_pos: float,
    sapo_temperature_neg: float,
    vespo_k_pos: float,
    vespo_lambda_pos: float,
    vespo_k_neg: float,
    vespo_lambda_neg: float,
    is_weights_per_sequence: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backend `backend`'s layer-2 kernel on flat [N] fp32 inputs, its options TokenLossOptions' fields in order ->
    (the kernel's sums [8], gℓ [N], gH [N]; [0] without entropy_coef)."""
    from grpo_fast.kernels.grpo_token_loss import KernelObjective, TokenLossOptions  # triton: imported on use

    kernel = get_backend(backend, logprobs.device).capabilities.token_loss_kernel
    options = TokenLossOptions(
        KernelObjective(objective), sequence_level, clip_low, clip_high, delta, beta, entropy_coef,
        use_bias_correction_kl, sapo_temperature_pos, sapo_temperature_neg, vespo_k_pos, vespo_lambda_pos,
        vespo_k_neg, vespo_lambda_neg, is_weights_per_sequence,
    )  # fmt: skip
    per_token = (old_logprobs, ref_logprobs, advantages, is_weights, loss_weights, entropy_weights, mask, seq_starts)
    sums, grad_logp, grad_entropy = kernel(logprobs, entropy, *per_token, options)
    return sums, grad_logp, logprobs.new_empty(0) if grad_entropy is None else grad_entropy


@token_loss_kernel_op.register_fake
def _(logprobs, entropy, *args):
    entropy_coef = args[15]  # after the 8 per-token tensors, the backend, objective ... beta
    grad_entropy = torch.empty_like(logprobs) if entropy_coef != 0.0 else logprobs.new_empty(0)
    return logprobs.new_empty(len(SUM_NAMES) - 1), torch.empty_like(logprobs), grad_entropy


def _setup_kernel_context(ctx, inputs, output):
    ctx.has_entropy = inputs[1] is not None
    ctx.save_for_backward(output[1], output[2])


def _kernel_backward(ctx, grad_sums, _grad_logp, _grad_entropy):
    """Only the loss (sums[0]) is differentiable: ∂/∂ℓ = g · gℓ, ∂/∂H = g · gH."""
    grad_logp, grad_entropy = ctx.saved_tensors
    upstream = grad_sums[0]
    d_entropy = None
    if ctx.has_entropy:
        d_entropy = upstream * grad_entropy if grad_entropy.numel() else torch.zeros_like(grad_logp)
    return (upstream * grad_logp, d_entropy, *([None] * 24))


token_loss_kernel_op.register_autograd(_kernel_backward, setup_context=_setup_kernel_context)


def with_masked_sum(kernel_sums: torch.Tensor) -> torch.Tensor:
    """The kernel's sums with the `masked` sum (0: its objectives drop no token) appended, as SUM_NAMES orders them."""
    missing = len(SUM_NAMES) - kernel_sums.numel()
    return torch.cat([kernel_sums, kernel_sums.new_zeros(missing)])


def kernel_options(config: GRPOLossConfig, is_weights_per_sequence: bool = False):
    """The loss options as the layer-2 kernels' plain numbers (TokenLossOptions)."""
    from grpo_fast.kernels.grpo_token_loss import KernelObjective, TokenLossOptions  # triton: imported on use

    return TokenLossOptions(
        objective=KernelObjective(config.objective_spec.kernel),
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

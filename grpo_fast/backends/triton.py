"""The `triton` backend: layer 1 and layer 2 as fused Triton kernels (grpo_fast.kernels).

Layer 1 (kernels/linear_logprobs.py): the forward streams vocabulary blocks through registers with
an online log-sum-exp; the backward recomputes each logits tile and accumulates dh, dW, db — with
fp32 atomics by default, or, for `deterministic=True` (GRPOLossConfig.deterministic), with two
atomic-free kernels in a fixed summation order (bitwise reproducible, one extra recompute).
Layer 2 (kernels/grpo_token_loss.py): one program per sequence, the twin of
grpo_fast.loss.token_math.grpo_token_loss.

There is no `forward_backward` (the 3-GEMM mode of the chunked backends): grpo_loss runs
forward -> token_loss -> backward (recompute, 4 GEMMs). Importing this module touches no GPU; on
CPU the kernels run only under TRITON_INTERPRET=1 (set before triton is imported).
"""

from __future__ import annotations

import torch

from ..kernels.grpo_token_loss import grpo_token_loss_triton
from ..kernels.linear_logprobs import linear_logprobs_backward, linear_logprobs_forward
from ..loss.layout import TokenLayout
from ..loss.options import GRPOLossConfig
from ..loss.token_math import TokenInputs, TokenLossOutput, grpo_token_loss
from .chunked import LogprobStats


class TritonBackend:
    """Layer-1 / layer-2 backend on the fused Triton kernels; `workspace_bytes` is ignored (no workspace)."""

    def __init__(self, deterministic: bool = False):
        self.deterministic = deterministic
        self.name = "triton"

    @property
    def deterministic_variant(self) -> TritonBackend:
        """The same backend with the atomic-free backward (what GRPOLossConfig(deterministic=True) uses)."""
        return TRITON_DETERMINISTIC_BACKEND

    def forward(
        self, hidden, weight, bias, targets, inv_temperature, workspace_bytes=None, softcap=0.0
    ) -> LogprobStats:
        """hidden [N, H], weight [V, H], bias [V] | None, targets [N] int64 -> LogprobStats ([N] fp32 each);
        softcap c > 0: logits c tanh((h Wᵀ + b) / c) / τ."""
        logp, entropy, lse = linear_logprobs_forward(hidden, weight, bias, targets, inv_temperature, softcap=softcap)
        return LogprobStats(logp, entropy, lse)

    def backward(
        self,
        hidden,
        weight,
        bias,
        targets,
        inv_temperature,
        stats: LogprobStats,
        grad_logp,
        grad_entropy,
        workspace_bytes=None,
        softcap=0.0,
    ):
        """-> (dh [N, H] in hidden's dtype, dW [V, H] fp32, db [V] fp32 | None), recomputing the logits tiles."""
        return linear_logprobs_backward(
            hidden,
            weight,
            bias,
            targets,
            inv_temperature,
            stats.lse,
            stats.entropy,
            grad_logp,
            grad_entropy,
            deterministic=self.deterministic,
            softcap=softcap,
        )

    def token_loss(
        self,
        logprobs: torch.Tensor,
        entropy: torch.Tensor | None,
        inputs: TokenInputs,
        layout: TokenLayout,
        config: GRPOLossConfig,
        rows: slice = slice(None),
    ) -> TokenLossOutput:
        """Layer 2 on the fused kernel (same signature and results as token_math.grpo_token_loss).

        Row subsets, non-fp32 (fp64 gradcheck) inputs and TRL's token masks (top_entropy_quantile,
        off_policy_mask_threshold; O(N) either way) go to the PyTorch twin."""
        whole = rows == slice(None) or (rows.start in (None, 0) and rows.stop in (None, layout.num_tokens))
        twin_only = config.top_entropy_quantile < 1.0 or config.off_policy_mask_threshold is not None
        if not whole or twin_only or logprobs.dtype != torch.float32 or layout.mask.dtype != torch.float32:
            return grpo_token_loss(logprobs, entropy, inputs, layout, config, rows)
        sums, grad_logp, grad_entropy = grpo_token_loss_triton(
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
            loss_type=config.loss_type,
            sequence_level=config.importance_sampling_level == "sequence",
            clip_low=config.epsilon_low,
            clip_high=config.clip_high,
            delta=config.delta,
            beta=config.beta,
            entropy_coef=config.entropy_coef,
            use_bias_correction_kl=config.use_bias_correction_kl,
            sapo_temperature_pos=config.sapo_temperature_pos,
            sapo_temperature_neg=config.sapo_temperature_neg,
            vespo_k_pos=config.vespo_k_pos,
            vespo_lambda_pos=config.vespo_lambda_pos,
            vespo_k_neg=config.vespo_k_neg,
            vespo_lambda_neg=config.vespo_lambda_neg,
            is_weights_per_sequence=inputs.is_weights_per_sequence,
        )
        return TokenLossOutput(sums, grad_logp, grad_entropy)


TRITON_BACKEND = TritonBackend(deterministic=False)
TRITON_DETERMINISTIC_BACKEND = TritonBackend(deterministic=True)

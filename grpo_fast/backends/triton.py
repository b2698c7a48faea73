"""The `triton` backend: layer 1 as fused Triton kernels (grpo_fast.kernels), and a layer-2 kernel.

Layer 1 (kernels/linear_logprobs.py): the forward streams vocabulary blocks through registers with
an online log-sum-exp; the backward recomputes each logits tile and accumulates dh, dW, db — with
fp32 atomics by default, or, in the deterministic variant (GRPOLossConfig.deterministic), with two
atomic-free kernels in a fixed summation order (bitwise reproducible, one extra recompute).
Layer 2 (kernels/grpo_token_loss.py), declared as `capabilities.token_loss_kernel`: one program per
sequence, the twin of grpo_fast.loss.token_math.grpo_token_loss; grpo_fast.loss.token_loss decides when
it runs and maps the loss options onto its plain-number options.

There are no `ChunkedHooks` (the 3-GEMM mode of the chunked backends): grpo_loss runs
forward -> token loss -> backward (recompute, 4 GEMMs). Importing this module touches no GPU; on
CPU the kernels run only under TRITON_INTERPRET=1 (set before triton is imported).
"""

from __future__ import annotations

import os

import torch

from ..kernels.grpo_token_loss import grpo_token_loss_triton
from ..kernels.linear_logprobs import linear_logprobs_backward, linear_logprobs_forward
from .base import Capabilities, LogprobStats


class TritonBackend:
    """A `Backend` on the fused Triton kernels; `workspace_bytes` is ignored (no workspace)."""

    name = "triton"
    capabilities = Capabilities(fused_gradients=False, token_loss_kernel=grpo_token_loss_triton)

    def __init__(self, deterministic: bool = False):
        self.deterministic = deterministic

    def availability(self, device: torch.device) -> str | None:
        if device.type == "cuda":
            return None
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
            return None
        hint = " (set TRITON_INTERPRET=1 before importing triton to run its kernels on CPU)"
        return f"runs on cuda tensors{hint if device.type == 'cpu' else ''}"

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


TRITON_BACKEND = TritonBackend(deterministic=False)
TRITON_DETERMINISTIC_BACKEND = TritonBackend(deterministic=True)

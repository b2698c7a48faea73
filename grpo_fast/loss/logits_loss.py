"""`logits_grpo_loss`: the GRPO loss for callers that already hold the logits `[B, T, V]`.

One memory-bound pass over the logits computes the per-token statistics (row chunks upcast to
fp32), layer 2 gives (gℓ, gH), and backward streams over the logits once more to write
∂L/∂logits = dz / τ — into the logits buffer itself with `inplace_backward=True`, so no second
`[B, T, V]` tensor is allocated. That is safe only when nothing else needs the logits' values
after this loss (e.g. they come straight from an lm_head matmul, whose backward does not read
its output); the buffer then holds the gradient, not the logits.
"""

from __future__ import annotations

import torch

from ..backends.chunked import TORCH_BACKEND, accumulation_dtype
from . import checks
from .batch import PerTokenArguments, PreparedBatch, prepare_batch
from .options import GRPOLossConfig
from .token_math import finalize_metrics, grpo_token_loss


class _LogitsGRPOLoss(torch.autograd.Function):
    """logits [N, V] -> (loss [], metric sums [K]); backward writes ∂L/∂logits chunk by chunk."""

    @staticmethod
    def forward(ctx, logits, batch: PreparedBatch, config: GRPOLossConfig, inplace_backward: bool):
        inv_temperature = 1.0 / config.temperature
        chunks = TORCH_BACKEND.row_chunks(logits.shape[0], logits.shape[1], logits.device, config.workspace_bytes)
        stats = torch.empty(3, logits.shape[0], dtype=accumulation_dtype(logits.dtype), device=logits.device)
        for rows in chunks:
            z = logits[rows].to(stats.dtype, copy=True).mul_(inv_temperature)
            for dst, value in zip(stats[:, rows], TORCH_BACKEND.epilogue.stats(z, batch.targets[rows]), strict=True):
                dst.copy_(value)
        logp, entropy, lse = stats.unbind(0)
        out = grpo_token_loss(logp, entropy, batch.inputs, batch.layout, config)
        ctx.chunks, ctx.inv_temperature, ctx.inplace_backward = chunks, inv_temperature, inplace_backward
        extra = (out.grad_entropy,) if out.grad_entropy is not None else ()
        ctx.save_for_backward(logits, batch.targets, lse, entropy, out.grad_logprobs, *extra)
        ctx.mark_non_differentiable(out.sums)
        return out.sums[0].clone(), out.sums

    @staticmethod
    def backward(ctx, grad_loss, _grad_sums):
        logits, targets, lse, entropy, grad_logp, *rest = ctx.saved_tensors
        grad_logp = grad_logp * grad_loss
        grad_entropy = rest[0] * grad_loss if rest else None
        grad_logits = logits if ctx.inplace_backward else torch.empty_like(logits)
        for rows in ctx.chunks:
            z = logits[rows].to(lse.dtype, copy=True).mul_(ctx.inv_temperature)
            g_h = None if grad_entropy is None else grad_entropy[rows]
            TORCH_BACKEND.epilogue.grad_(z, targets[rows], lse[rows], entropy[rows], grad_logp[rows], g_h)
            grad_logits[rows].copy_(z.mul_(ctx.inv_temperature))
        return grad_logits, None, None, None


def logits_grpo_loss(
    logits: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    config: GRPOLossConfig = GRPOLossConfig(),
    *,
    cu_seqlens: torch.Tensor | None = None,
    inplace_backward: bool = False,
    rollout_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`grpo_loss` from logits [B, T, V] (or packed [N, V] with cu_seqlens); same options and metrics, but for
    the head's (logit_scale, final_logit_softcapping: the logits are the model's, scaled and capped already).

    inplace_backward=True writes ∂L/∂logits into `logits` during backward (see module docstring).
    """
    logits = checks.require_tensor("logits", logits)
    checks.require_floating("logits", logits)
    if inplace_backward and not logits.is_contiguous():
        raise ValueError("logits: inplace_backward=True needs a contiguous logits tensor")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits: expected a vocabulary of at least 1 in the last dimension, got {list(logits.shape)}")
    batch = prepare_batch(
        PerTokenArguments(
            completion_ids, completion_mask, advantages, old_logprobs, ref_logprobs, is_weights, rollout_logprobs
        ),
        num_items_in_batch=num_items_in_batch,
        cu_seqlens=cu_seqlens,
        config=config,
        vocab=logits.shape[-1],
        source_name="logits",
        source=logits,
        dtype=accumulation_dtype(logits.dtype),
    )
    if config.logit_scale != 1.0 or config.final_logit_softcapping is not None:  # config checked by prepare_batch
        raise ValueError(
            "config.logit_scale / final_logit_softcapping: they make logits of hidden states (grpo_loss); "
            "logits_grpo_loss takes the model's logits, scaled and capped already: leave them at 1.0 / None"
        )
    flat_logits = logits.view(-1, logits.shape[-1]) if logits.is_contiguous() else logits.reshape(-1, logits.shape[-1])
    loss, sums = _LogitsGRPOLoss.apply(flat_logits, batch, config, inplace_backward)
    return loss, finalize_metrics(sums.detach(), batch.layout, config, is_weights is not None)

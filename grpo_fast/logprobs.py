"""`fused_logprobs`: per-token log p(y | h) and entropy straight from hidden states and the lm_head
weight, differentiable, without materialising `[N, V]` logits (layer 1 on its own)."""

from __future__ import annotations

import torch

from . import checks
from .backends import get_backend


def check_linear_inputs(hidden, weight, bias, targets_shape_name: str = "targets"):
    """Validate hidden [..., H], weight [V, H], bias [V] | None; return (hidden [N, H] contiguous, leading shape)."""
    hidden = checks.require_tensor("hidden", hidden)
    weight = checks.require_tensor("weight", weight)
    checks.require_floating("hidden", hidden)
    checks.require_floating("weight", weight)
    if hidden.dim() not in (2, 3):
        raise ValueError(f"hidden: expected shape [N, H] or [B, T, H], got {list(hidden.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight: expected shape [V, H={hidden.shape[-1]}] (lm_head weight), got {list(weight.shape)}")
    checks.require_device("weight", weight, hidden.device)
    if weight.dtype != hidden.dtype:
        raise TypeError(f"weight: expected dtype {hidden.dtype} (the dtype of hidden), got {weight.dtype}")
    if bias is not None:
        bias = checks.require_tensor("bias", bias)
        checks.require_shape("bias", bias, (weight.shape[0],), "[V] like weight's rows")
        checks.require_device("bias", bias, hidden.device)
        if bias.dtype != hidden.dtype:
            raise TypeError(f"bias: expected dtype {hidden.dtype} (the dtype of hidden), got {bias.dtype}")
    return hidden.reshape(-1, hidden.shape[-1]).contiguous(), tuple(hidden.shape[:-1])


def check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature: expected a positive number, got {temperature!r}")
    if temperature == float("inf"):
        raise ValueError("temperature: expected a finite number, got inf")
    return float(temperature)


class _FusedLogprobs(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], bias [V] | None, targets [N]) -> (logp [N], entropy [N]) fp32.

    Backward recomputes the logits tiles (layer 1's recompute mode, 4 GEMMs in all)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, inv_temperature, backend, workspace_bytes):
        stats = backend.forward(hidden, weight, bias, targets, inv_temperature, workspace_bytes)
        ctx.save_for_backward(hidden, weight, bias, targets, stats.lse, stats.entropy)
        ctx.inv_temperature, ctx.backend, ctx.workspace_bytes = inv_temperature, backend, workspace_bytes
        return stats.logprobs, stats.entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        from .backends import LogprobStats

        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        if grad_logp is None:
            grad_logp = torch.zeros_like(lse)
        stats = LogprobStats(None, entropy, lse)
        grad_h, grad_w, grad_b = ctx.backend.backward(
            hidden,
            weight,
            bias,
            targets,
            ctx.inv_temperature,
            stats,
            grad_logp.to(lse.dtype).contiguous(),
            None if grad_entropy is None else grad_entropy.to(lse.dtype).contiguous(),
            ctx.workspace_bytes,
        )
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w.to(weight.dtype), grad_b, None, None, None, None


def fused_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    backend: str = "auto",
    return_entropy: bool = False,
    bias: torch.Tensor | None = None,
    workspace_bytes: int | None = None,
):
    """log softmax((h Wᵀ + b) / τ)[y] per token, and optionally the entropy of that softmax.

    hidden [N, H] or [B, T, H]; weight [V, H] (same dtype); targets [N] or [B, T] int64 in [0, V).
    Returns fp32 `logp` shaped like targets, or `(logp, entropy)` when return_entropy. Differentiable
    w.r.t. hidden, weight and bias, through either output.
    """
    flat_hidden, leading = check_linear_inputs(hidden, weight, bias)
    targets = checks.require_tensor("targets", targets)
    checks.require_integer("targets", targets)
    checks.require_shape("targets", targets, leading, "the leading dimensions of hidden")
    checks.require_device("targets", targets, flat_hidden.device)
    checks.require_token_ids("targets", targets, weight.shape[0])
    inv_temperature = 1.0 / check_temperature(temperature)
    impl = get_backend(backend, flat_hidden.device)
    logp, entropy = _FusedLogprobs.apply(
        flat_hidden,
        weight.contiguous(),
        None if bias is None else bias.contiguous(),
        targets.reshape(-1).to(torch.int64).contiguous(),
        inv_temperature,
        impl,
        workspace_bytes,
    )
    logp = logp.view(leading)
    return (logp, entropy.view(leading)) if return_entropy else logp

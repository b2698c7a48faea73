"""`fused_logprobs`: per-token log p(y | h) and entropy straight from hidden states and the lm_head
weight, differentiable, without materialising `[N, V]` logits (layer 1 on its own)."""

from __future__ import annotations

import torch

from ..backends import LogprobStats, get_backend
from ..backends.chunked import accumulation_dtype
from . import checks
from .head import LogitHead


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
    if 0 in weight.shape:
        raise ValueError(f"weight: expected a vocabulary and a hidden size of at least 1, got {list(weight.shape)}")
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


@torch.compiler.assume_constant_result
def backend_name(backend: str, device_type: str) -> str:
    """The concrete backend that `backend` ("auto" or a name) resolves to on this device type."""
    return get_backend(backend, torch.device(device_type)).name


def _resolve(backend: str, device: torch.device, deterministic: bool):
    impl = get_backend(backend, device)
    return impl.deterministic_variant() if deterministic else impl


# Layer 1 as torch.library custom ops with fake implementations and a registered autograd formula,
# so torch.compile(fullgraph=True) traces through fused_logprobs. Backward recomputes the logits
# tiles (layer 1's recompute mode, 4 GEMMs in all).
@torch.library.custom_op("grpo_fast::linear_logprobs", mutates_args=())
def linear_logprobs_op(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    inv_temperature: float,
    softcap: float,
    backend: str,
    deterministic: bool,
    workspace_bytes: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden [N, H], weight [V, H], bias [V] | None, targets [N]) -> (logp, entropy, lse) [N] of the logits
    softcap tanh((h Wᵀ + b) / softcap) · inv_temperature ((h Wᵀ + b) · inv_temperature for softcap 0)."""
    impl = _resolve(backend, hidden.device, deterministic)
    stats = impl.forward(hidden, weight, bias, targets, inv_temperature, workspace_bytes or None, softcap=softcap)
    return stats.logprobs, stats.entropy, stats.lse


@linear_logprobs_op.register_fake
def _(hidden, weight, bias, targets, inv_temperature, softcap, backend, deterministic, workspace_bytes):
    dtype = accumulation_dtype(hidden.dtype)
    return tuple(hidden.new_empty(hidden.shape[0], dtype=dtype) for _ in range(3))


@torch.library.custom_op("grpo_fast::linear_logprobs_backward", mutates_args=())
def _linear_logprobs_backward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    inv_temperature: float,
    softcap: float,
    backend: str,
    deterministic: bool,
    workspace_bytes: int,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    grad_logp: torch.Tensor,
    grad_entropy: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dh [N, H] like hidden, dW [V, H] like weight, db [V] like bias; empty when bias is None)."""
    impl = _resolve(backend, hidden.device, deterministic)
    stats = LogprobStats(None, entropy, lse)
    grad_h, grad_w, grad_b = impl.backward(
        hidden,
        weight,
        bias,
        targets,
        inv_temperature,
        stats,
        grad_logp,
        grad_entropy,
        workspace_bytes or None,
        softcap=softcap,
    )
    grad_b = hidden.new_empty(0) if grad_b is None else grad_b.to(bias.dtype)
    return grad_h, grad_w.to(weight.dtype), grad_b


@_linear_logprobs_backward.register_fake
def _(hidden, weight, bias, targets, inv_temperature, softcap, backend, deterministic, workspace_bytes, *grads):
    return (
        torch.empty_like(hidden),
        torch.empty_like(weight),
        hidden.new_empty(0) if bias is None else torch.empty_like(bias),
    )


def _setup_context(ctx, inputs, output):
    hidden, weight, bias, targets, inv_temperature, softcap, backend, deterministic, workspace_bytes = inputs
    ctx.save_for_backward(hidden, weight, bias, targets, output[2], output[1])
    ctx.options = (inv_temperature, softcap, backend, deterministic, workspace_bytes)


def _backward(ctx, grad_logp, grad_entropy, _grad_lse):
    hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
    if grad_logp is None:
        grad_logp = torch.zeros_like(lse)
    grad_h, grad_w, grad_b = _linear_logprobs_backward(
        hidden,
        weight,
        bias,
        targets,
        *ctx.options,
        lse,
        entropy,
        grad_logp.to(lse.dtype).contiguous(),
        None if grad_entropy is None else grad_entropy.to(lse.dtype).contiguous(),
    )
    return grad_h, grad_w, None if bias is None else grad_b, None, None, None, None, None, None


linear_logprobs_op.register_autograd(_backward, setup_context=_setup_context)


def fused_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    backend: str = "auto",
    return_entropy: bool = False,
    bias: torch.Tensor | None = None,
    workspace_bytes: int | None = None,
    deterministic: bool = False,
    logit_scale: float = 1.0,
    final_logit_softcapping: float | None = None,
):
    """log softmax(z)[y] per token, and optionally the entropy of that softmax, for the logits
    z = (h Wᵀ + b) · s / τ, or z = c tanh((h Wᵀ + b) · s / c) / τ with a soft cap (TRL's order).

    hidden [N, H] or [B, T, H]; weight [V, H] (same dtype); targets [N] or [B, T] int64 in [0, V).
    Returns fp32 `logp` shaped like targets, or `(logp, entropy)` when return_entropy. Differentiable
    w.r.t. hidden, weight and bias, through either output; traceable by torch.compile(fullgraph=True).
    deterministic: the Triton backward without float atomics. logit_scale s and final_logit_softcapping c
    (None: no cap) are the model's head transform (`grpo_fast.loss.head.logit_head(model)` reads them).
    """
    flat_hidden, leading = check_linear_inputs(hidden, weight, bias)
    targets = checks.require_tensor("targets", targets)
    checks.require_integer("targets", targets)
    checks.require_shape("targets", targets, leading, "the leading dimensions of hidden")
    checks.require_device("targets", targets, flat_hidden.device)
    if not torch.compiler.is_compiling():  # a value check would break the graph
        checks.require_token_ids("targets", targets, weight.shape[0])
    head = LogitHead(logit_scale, final_logit_softcapping)
    inv_temperature, softcap = head.tile(check_temperature(temperature))
    checks.require_options(workspace_bytes, return_entropy=return_entropy, deterministic=deterministic)
    name = backend_name(backend, flat_hidden.device.type)  # resolve "auto" (and fail early) outside the op
    logp, entropy, _ = linear_logprobs_op(
        flat_hidden,
        weight.contiguous(),
        None if bias is None else bias.contiguous(),
        targets.reshape(-1).to(torch.int64).contiguous(),
        inv_temperature,
        softcap,
        name,
        deterministic,
        workspace_bytes or 0,
    )
    logp = logp.view(leading)
    return (logp, entropy.view(leading)) if return_entropy else logp


def logprobs_with_config(hidden, weight, targets, config, bias=None) -> torch.Tensor:
    """`fused_logprobs` with every option of a GRPOLossConfig that layer 1 reads (temperature, the model's head,
    backend, workspace, determinism), so that old- and reference-logprob passes run the loss's own layer 1."""
    return fused_logprobs(
        hidden,
        weight,
        targets,
        temperature=config.temperature,
        backend=config.backend,
        bias=bias,
        workspace_bytes=config.workspace_bytes,
        deterministic=config.deterministic,
        logit_scale=config.logit_scale,
        final_logit_softcapping=config.final_logit_softcapping,
    )

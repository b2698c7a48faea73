"""A fuzz case through the public API on the backend under test: the quantities every check compares.

Quantities (a dict name -> tensor): "loss" and "metric/<TRL name>" (grpo_loss, GRPOLoss, logits_grpo_loss),
"logp" and "entropy" [N] (fused_logprobs), and "grad/<leaf>" for hidden ([N, H]), weight, bias and logits
([N, V]). fused_logprobs' gradients are those of Σ gℓ·logp + Σ gH·entropy.
"""

from __future__ import annotations

import torch

from ...loss import GRPOLoss, GRPOLossConfig, fused_logprobs, grpo_loss, logits_grpo_loss
from .inputs import FuzzInputs

TOKEN_ARGUMENTS = ("completion_ids", "completion_mask", "advantages", "old_logprobs", "ref_logprobs", "is_weights")
TOKEN_ARGUMENTS += ("rollout_logprobs",)


def run_entry_point(params: dict, inputs: FuzzInputs) -> dict[str, torch.Tensor]:
    """The quantities of the case's entry point (params["api"]) on its backend (params["config"])."""
    args = arguments(params, inputs)
    leaves = {name: args[name] for name in ("hidden", "weight", "bias", "logits") if args.get(name) is not None}
    leaves = {name: value.detach().clone().requires_grad_() for name, value in leaves.items()}
    if "logits" in leaves:  # as an lm_head output: an in-place backward may overwrite it, not the leaf
        args["logits"] = leaves["logits"].clone()
    else:
        args |= leaves
    out = call(params, args)
    if params["api"] == "fused_logprobs":
        return _logprobs_quantities(params, inputs, args, out, leaves)
    loss, metrics = out
    accumulation = torch.float64 if params["dtype"] == "float64" else torch.float32
    _require(loss.dim() == 0 and loss.dtype == accumulation, f"loss: {loss.dtype} {list(loss.shape)}")
    for name, value in metrics.items():
        _require(value.dim() == 0 and not value.requires_grad, f"metric {name}: not a detached 0-dim tensor")
    quantities = {"loss": loss.detach()} | {f"metric/{name}": value for name, value in metrics.items()}
    return quantities | _grads(loss, leaves)


def arguments(params: dict, inputs: FuzzInputs) -> dict:
    """The keyword arguments of the case's call: the entry point's own names, plus "config" (a GRPOLossConfig;
    fused_logprobs takes its fields one by one)."""
    config = GRPOLossConfig(**params["config"])
    if params["api"] == "fused_logprobs":
        hidden, targets = inputs.hidden, inputs.targets
        if params["flat_targets"]:
            hidden = hidden.reshape(-1, hidden.shape[-1])
        else:
            targets = targets.view(hidden.shape[:-1])
        return dict(
            hidden=hidden,
            weight=inputs.weight,
            targets=targets,
            temperature=config.temperature,
            backend=config.backend,
            return_entropy=params["return_entropy"],
            bias=inputs.bias,
            workspace_bytes=config.workspace_bytes,
            deterministic=config.deterministic,
            logit_scale=config.logit_scale,
            final_logit_softcapping=config.final_logit_softcapping,
        )
    args = {name: inputs.token[name] for name in TOKEN_ARGUMENTS}
    args |= dict(num_items_in_batch=inputs.num_items_in_batch, config=config, cu_seqlens=inputs.cu_seqlens)
    if params["api"] == "logits_grpo_loss":
        return args | dict(logits=inputs.logits, inplace_backward=params["inplace_backward"])
    return args | dict(hidden=inputs.hidden, weight=inputs.weight, bias=inputs.bias)


def call(params: dict, args: dict):
    """The case's entry point called with `args` (see `arguments`)."""
    api = params["api"]
    if api == "fused_logprobs":
        return fused_logprobs(**args)
    if api == "logits_grpo_loss":
        return logits_grpo_loss(**args)
    if api == "grpo_loss":
        return grpo_loss(**args)
    args = dict(args)
    config = args.pop("config")
    if params["module_from_keywords"] and isinstance(config, GRPOLossConfig):
        module = GRPOLoss(**{name: getattr(config, name) for name in params["config"]})
    else:
        module = GRPOLoss(config)
    return module(**args)


def _logprobs_quantities(params, inputs: FuzzInputs, args, out, leaves) -> dict[str, torch.Tensor]:
    targets = args["targets"]
    logp, entropy = out if params["return_entropy"] else (out, None)
    accumulation = torch.float64 if params["dtype"] == "float64" else torch.float32
    _require(logp.shape == targets.shape and logp.dtype == accumulation, f"logp: {logp.dtype} {list(logp.shape)}")
    grad_logp, grad_entropy = (g.to(logp.dtype).view(targets.shape) for g in inputs.upstream)
    objective = (logp * grad_logp).sum() + (0.0 if entropy is None else (entropy * grad_entropy).sum())
    values = {"logp": logp.detach().reshape(-1)}
    if entropy is not None:
        values["entropy"] = entropy.detach().reshape(-1)
    return values | _grads(objective, leaves)


def _grads(objective: torch.Tensor, leaves: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    grads = torch.autograd.grad(objective, list(leaves.values()))
    out = {}
    for (name, leaf), grad in zip(leaves.items(), grads, strict=True):
        _require(grad.dtype == leaf.dtype and grad.shape == leaf.shape, f"grad of {name}: {grad.dtype} {grad.shape}")
        out[f"grad/{name}"] = grad.reshape(-1, grad.shape[-1]) if name in ("hidden", "logits") else grad
    return out


def _require(condition: bool, message: str) -> None:
    """The API's output contract (dtypes, shapes, detached metrics)."""
    if not condition:
        raise AssertionError(f"output contract: {message}")

"""The quantities of `grpo_fast.testing.fuzz.run` from the naive reference (grpo_fast.testing.reference:
materialised logits, TRL's formulas, autograd), in fp64 (the oracle) or in the case's own precision (the
tolerance rule's peer).

The reference takes padded batches only: a packed case is laid out as [B, Tp] (Tp its longest sequence), and
every masked position gets neutral values (old and reference logprobs equal to the current ones, weight 1,
token id 0), since the loss ignores what masked positions hold (NaN, inf, ids out of range).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ...loss import GRPOLossConfig
from ..reference import loss_from_logprobs, naive_logprobs_and_entropy
from .inputs import FuzzInputs


class Trace(NamedTuple):
    """What the reference's layer 2 saw and sent back, per token [N]: the logprobs and entropies it received,
    ∂L/∂logp, ∂L/∂entropy, ∂L/∂ref_logprobs (zeros where unused), and `layer2(logp, entropy) -> (loss,
    metrics)` to evaluate it again on other per-token values [N] (None for fused_logprobs, which has none)."""

    logp: torch.Tensor
    entropy: torch.Tensor
    grad_logp: torch.Tensor
    grad_entropy: torch.Tensor
    grad_ref: torch.Tensor
    layer2: Callable | None


def reference_outputs(params: dict, inputs: FuzzInputs, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], Trace]:
    """(quantities, Trace): the case's quantities from the reference with hidden, weight, bias (or logits) in
    `dtype` and the per-token inputs in fp32 (fp64 when `dtype` is fp64)."""
    aux = torch.float64 if dtype == torch.float64 else torch.float32
    config = GRPOLossConfig(**params["config"])
    leaves = _leaves(inputs, dtype)
    if params["api"] == "fused_logprobs":
        return _logprobs(params, inputs, config, leaves)
    rows = inputs.rows
    logp, entropy = _layer1(inputs, config, leaves, dtype)
    mask = rows.to_padded(rows.mask.to(aux), 0.0)
    old, ref = _flat_leaf(inputs, "old_logprobs", aux), _flat_leaf(inputs, "ref_logprobs", aux)
    rollout = _flat_leaf(inputs, "rollout_logprobs", aux)
    advantages = _per_token_argument(inputs, "advantages", aux, 0.0)
    is_weights = _per_token_argument(inputs, "is_weights", aux, 1.0)

    def layer2(logp, entropy):
        """(loss, metrics) of padded logprobs and entropies [B, Tp]."""
        return loss_from_logprobs(
            logp,
            entropy,
            mask,
            advantages,
            _logprobs_argument(inputs, "old_logprobs", old, mask, logp),
            _logprobs_argument(inputs, "ref_logprobs", ref, mask, logp),
            is_weights,
            inputs.num_items_in_batch,
            config=config,
            rollout_logprobs=_logprobs_argument(inputs, "rollout_logprobs", rollout.detach(), mask, logp),
        )

    loss, metrics = layer2(logp, entropy)
    grad_logp, grad_entropy, grad_ref, *grads = torch.autograd.grad(
        loss, [logp, entropy, ref, *leaves.values()], allow_unused=True, materialize_grads=True
    )
    out = {"loss": loss.detach(), **{f"metric/{name}": value for name, value in metrics.items()}}
    out |= {f"grad/{name}": grad for name, grad in zip(leaves, grads, strict=True)}
    per_token = (rows.from_padded(t) for t in (logp.detach(), entropy.detach(), grad_logp, grad_entropy))

    def flat_layer2(flat_logp, flat_entropy):
        padded_logp = rows.to_padded(flat_logp, logp.detach())
        return layer2(padded_logp, rows.to_padded(flat_entropy, entropy.detach()))

    return out, Trace(*per_token, grad_ref, flat_layer2)


def _layer1(inputs: FuzzInputs, config: GRPOLossConfig, leaves, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy) [B, Tp] of the padded layout, differentiable w.r.t. the leaves."""
    rows, ids = inputs.rows, _padded_ids(inputs)
    if "logits" not in leaves:
        return naive_logprobs_and_entropy(
            rows.to_padded(leaves["hidden"], 0.0),
            leaves["weight"],
            ids,
            config.temperature,
            leaves.get("bias"),
            config.logit_scale,
            config.final_logit_softcapping,
        )
    logits = rows.to_padded(leaves["logits"], 0.0)
    logits = logits.float() if dtype != torch.float64 else logits
    log_probs = torch.log_softmax(logits / config.temperature, dim=-1)
    logp = log_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return logp, -(log_probs.exp() * log_probs).sum(-1)


def _leaves(inputs: FuzzInputs, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The differentiable inputs in `dtype`: hidden [N, H] (flat rows), weight, bias; or logits [N, V]."""
    if inputs.logits is not None:
        leaves = {"logits": inputs.logits.reshape(-1, inputs.logits.shape[-1])}
    else:
        leaves = {"hidden": inputs.hidden.reshape(-1, inputs.hidden.shape[-1]), "weight": inputs.weight}
        if inputs.bias is not None:
            leaves["bias"] = inputs.bias
    return {name: t.detach().to(dtype).requires_grad_() for name, t in leaves.items()}


def _logprobs(params, inputs: FuzzInputs, config: GRPOLossConfig, leaves) -> tuple[dict[str, torch.Tensor], Trace]:
    logp, entropy = naive_logprobs_and_entropy(
        leaves["hidden"].unsqueeze(0),
        leaves["weight"],
        inputs.targets.unsqueeze(0),
        config.temperature,
        leaves.get("bias"),
        config.logit_scale,
        config.final_logit_softcapping,
    )
    logp, entropy = logp.view(-1), entropy.view(-1)
    grad_logp, grad_entropy = (g.to(logp.dtype) for g in inputs.upstream)
    if not params["return_entropy"]:
        grad_entropy = torch.zeros_like(grad_entropy)
    out = {"logp": logp.detach()} | ({"entropy": entropy.detach()} if params["return_entropy"] else {})
    grads = torch.autograd.grad((logp * grad_logp).sum() + (entropy * grad_entropy).sum(), list(leaves.values()))
    out |= {f"grad/{name}": grad for name, grad in zip(leaves, grads, strict=True)}
    trace = Trace(logp.detach(), entropy.detach(), grad_logp, grad_entropy, torch.zeros_like(grad_logp), None)
    return out, trace


def _padded_ids(inputs: FuzzInputs) -> torch.Tensor:
    rows = inputs.rows
    ids = inputs.token["completion_ids"].reshape(-1)
    return rows.to_padded(torch.where(rows.mask, ids, torch.zeros_like(ids)), 0)


def _per_token_argument(inputs: FuzzInputs, name: str, aux, fill: float) -> torch.Tensor | None:
    """advantages / is_weights as the reference takes them: [B] when given per sequence (`fill` for a sequence
    without active tokens: a padded [B, 1] per-token input at T = 1 may hold junk there), else [B, Tp] with
    `fill` at masked positions."""
    if inputs.token[name] is None:
        return None
    rows, value = inputs.rows, inputs.token[name].reshape(-1).to(aux)
    if inputs.per_sequence(name):
        active = torch.zeros(rows.batch, dtype=torch.bool).index_fill_(0, rows.seq[rows.mask], True)
        return torch.where(active, value, torch.full_like(value, fill))
    return rows.to_padded(torch.where(rows.mask, value, torch.full_like(value, fill)), fill)


def _flat_leaf(inputs: FuzzInputs, name: str, aux) -> torch.Tensor:
    """old / reference / the engine's logprobs [N] in `aux`, 0 at masked positions, differentiable (zeros when not
    given)."""
    rows, value = inputs.rows, inputs.token[name]
    flat = torch.zeros(rows.seq.numel(), dtype=aux) if value is None else value.reshape(-1).to(aux)
    return torch.where(rows.mask, flat, torch.zeros_like(flat)).requires_grad_()


def _logprobs_argument(inputs: FuzzInputs, name: str, flat: torch.Tensor, mask, logp) -> torch.Tensor | None:
    """old / reference / the engine's logprobs [B, Tp] from their flat leaf, the reference's own current logprobs at
    masked positions; None when the case gives none."""
    if inputs.token[name] is None:
        return None
    padded = inputs.rows.to_padded(flat, 0.0)
    return torch.where(mask > 0, padded, logp.detach().to(flat.dtype))

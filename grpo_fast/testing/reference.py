"""The naive GRPO loss: materialise the `[B, T, V]` logits, log_softmax, gather — what TRL's
`GRPOTrainer._compute_loss` does — with autograd for the gradients. It is the independent oracle
of the tests (run in fp64) and the "naive" baseline of the benchmarks. Padded layout only.
"""

from __future__ import annotations

import torch

from ..loss.loss_types import Objective, Reduction
from ..loss.options import GRPOLossConfig


def naive_logprobs_and_entropy(hidden, weight, targets, temperature=1.0, bias=None):
    """hidden [B, T, H], weight [V, H], targets [B, T] -> (logp, entropy) [B, T], through full logits."""
    logits = hidden @ weight.t()
    if bias is not None:
        logits = logits + bias
    logits = logits.float() / temperature if logits.dtype != torch.float64 else logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy


def naive_grpo_loss(
    hidden, weight, completion_ids, *args, config: GRPOLossConfig = GRPOLossConfig(), bias=None, **kwargs
):
    """TRL's loss, line for line, on materialised logits: hidden [B, T, H], weight [V, H], completion_ids
    [B, T], then `loss_from_logprobs`'s arguments from completion_mask on. Returns (loss, metrics dict)."""
    logp, entropy = naive_logprobs_and_entropy(hidden, weight, completion_ids, config.temperature, bias)
    return loss_from_logprobs(logp, entropy, *args, config=config, **kwargs)


def loss_from_logprobs(
    logp,
    entropy,
    completion_mask,
    advantages,
    old_logprobs=None,
    ref_logprobs=None,
    is_weights=None,
    num_items_in_batch=None,
    config: GRPOLossConfig = GRPOLossConfig(),
):
    """TRL's `_compute_loss` from per-token logprobs and entropies [B, T] (however they were computed):
    the loss type's objective and reduction (the loss-type table) pick TRL's formulas."""
    objective, reduction = config.loss_spec.objective, config.loss_spec.reduction
    mask = completion_mask.to(logp.dtype)
    adv = advantages.to(logp.dtype)
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    old = logp.detach() if old_logprobs is None else old_logprobs.to(logp.dtype)
    log_ratio = logp - old
    if config.importance_sampling_level == "token":
        log_weights = log_ratio
    else:
        log_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_weights)
    if config.beta != 0.0:
        ref = ref_logprobs.to(logp.dtype)
        per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1
    eps_high = config.clip_high
    if objective is Objective.CISPO:
        clamped = torch.clamp(coef_1, max=eps_high).detach()
        per_token_loss = -clamped * adv * logp
    elif objective is Objective.CLIPPED:
        coef_2 = torch.clamp(coef_1, 1 - config.epsilon_low, 1 + eps_high)
        if config.delta is not None:
            coef_1 = torch.clamp(coef_1, max=config.delta)
        per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
    else:
        raise NotImplementedError(f"reference: no objective {objective.value!r}")
    if is_weights is not None:
        weights = is_weights.to(logp.dtype)
        per_token_loss = per_token_loss * (weights.unsqueeze(1) if weights.dim() == 1 else weights)
    if config.beta != 0.0:
        per_token_loss = per_token_loss + config.beta * per_token_kl
    batch, length = mask.shape
    if reduction is Reduction.SEQUENCE_MEAN:
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif reduction is Reduction.TOKEN_MEAN:
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif reduction is Reduction.CONSTANT_LENGTH:
        loss = (per_token_loss * mask).sum() / (batch * (config.max_completion_length or length))
    elif reduction is Reduction.GLOBAL_TOKEN_MEAN:
        normaliser = mask.sum() if num_items_in_batch is None else torch.as_tensor(float(num_items_in_batch))
        loss = (per_token_loss * mask).sum() / normaliser.clamp(min=1.0)
    else:
        raise NotImplementedError(f"reference: no reduction {reduction.value!r}")
    if config.entropy_coef != 0.0:
        loss = loss - config.entropy_coef * (entropy * mask).sum() / mask.sum().clamp(min=1.0)

    count = mask.sum().clamp(min=1.0)

    def masked_mean(x):
        return ((x.expand_as(mask) * mask).sum() / count).detach()

    metrics = {}
    if config.beta != 0.0:
        metrics["kl"] = masked_mean(per_token_kl)
    if objective is Objective.CISPO:
        high = ((coef_1 > eps_high) & (adv > 0)).to(logp.dtype)
        low = torch.zeros_like(high)
    else:
        low = ((coef_1 < 1 - config.epsilon_low) & (adv < 0)).to(logp.dtype)
        high = ((coef_1 > 1 + eps_high) & (adv > 0)).to(logp.dtype)
    metrics["clip_ratio/low_mean"] = masked_mean(low)
    metrics["clip_ratio/high_mean"] = masked_mean(high)
    metrics["clip_ratio/region_mean"] = masked_mean(torch.clamp(low + high, max=1.0))
    metrics["entropy"] = masked_mean(entropy)
    metrics["logprob_mean"] = masked_mean(logp)
    if is_weights is not None:
        w = is_weights.to(logp.dtype)
        metrics["is_weight_mean"] = masked_mean(w.unsqueeze(1) if w.dim() == 1 else w)
    return loss, metrics

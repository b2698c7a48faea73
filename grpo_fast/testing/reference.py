"""The naive GRPO loss: materialise the `[B, T, V]` logits, log_softmax, gather — what TRL's
`GRPOTrainer._compute_loss` does — with autograd for the gradients. It is the independent oracle
of the tests (run in fp64) and the "naive" baseline of the benchmarks. Padded layout only.
"""

from __future__ import annotations

import math

import torch

from ..loss.loss_types import Objective, Reduction
from ..loss.options import GRPOLossConfig


def naive_logprobs_and_entropy(
    hidden, weight, targets, temperature=1.0, bias=None, logit_scale=1.0, final_logit_softcapping=None
):
    """hidden [B, T, H], weight [V, H], targets [B, T] -> (logp, entropy) [B, T], through full logits
    c tanh(s (h Wᵀ + b) / c) / T (the model's head, TRL's order; no cap when c is None)."""
    logits = hidden @ weight.t()
    if bias is not None:
        logits = logits + bias
    logits = (logits.float() if logits.dtype != torch.float64 else logits) * logit_scale
    if final_logit_softcapping is not None:
        logits = final_logit_softcapping * torch.tanh(logits / final_logit_softcapping)
    logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy


def naive_grpo_loss(
    hidden, weight, completion_ids, *args, config: GRPOLossConfig = GRPOLossConfig(), bias=None, **kwargs
):
    """TRL's loss, line for line, on materialised logits: hidden [B, T, H], weight [V, H], completion_ids
    [B, T], then `loss_from_logprobs`'s arguments from completion_mask on. Returns (loss, metrics dict)."""
    logp, entropy = naive_logprobs_and_entropy(
        hidden, weight, completion_ids, config.temperature, bias, config.logit_scale, config.final_logit_softcapping
    )
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
    weights = None
    if is_weights is not None:
        weights = is_weights.to(logp.dtype)
        weights = weights.unsqueeze(1) if weights.dim() == 1 else weights
    entropy_mask = None
    if config.top_entropy_quantile < 1.0:  # TRL's get_high_entropy_mask (one process)
        local = entropy.detach()[mask.bool()].float()
        if local.numel() == 0:
            entropy_mask = torch.zeros_like(mask, dtype=torch.bool)
        else:
            threshold = torch.quantile(local, 1 - config.top_entropy_quantile)
            entropy_mask = (entropy.detach() * mask >= threshold) & mask.bool()
    if config.off_policy_mask_threshold is not None:  # TRL's get_off_policy_mask, against the old logprobs
        kl_div = torch.nan_to_num(old - logp.detach(), nan=0.0)
        avg_seq_kl = (kl_div * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
        off_policy_mask = ((adv >= 0) | (avg_seq_kl <= config.off_policy_mask_threshold)).to(mask.dtype)
    log_ratio = logp - old
    if config.importance_sampling_level == "token":
        log_weights = log_ratio
    else:
        log_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_weights)
    if config.beta != 0.0:
        ref = ref_logprobs.to(logp.dtype)
        per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1
        if config.use_bias_correction_kl:
            per_token_kl = per_token_kl * coef_1
    eps_high = config.clip_high

    def scalar(value):  # hyper-parameters as tensors of the computation's dtype (fp64 stays fp64)
        return logp.new_tensor(value)

    if objective is Objective.CISPO:
        clamped = torch.clamp(coef_1, max=eps_high).detach()
        per_token_loss = -clamped * adv * logp
    elif objective is Objective.CLIPPED:
        coef_2 = torch.clamp(coef_1, 1 - config.epsilon_low, 1 + eps_high)
        if config.delta is not None:
            coef_1 = torch.clamp(coef_1, max=config.delta)
        per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
    elif objective is Objective.SAPO:
        tau = torch.where(adv > 0, scalar(config.sapo_temperature_pos), scalar(config.sapo_temperature_neg))
        per_token_loss = -torch.sigmoid(tau * (coef_1 - 1)) * 4 / tau * adv
    elif objective is Objective.VESPO:
        phi = _gamma_weights(adv, log_ratio, mask, weights, config, scalar)
        per_token_loss = -phi * adv * logp
    else:
        raise NotImplementedError(f"reference: no objective {objective.value!r}")
    if config.off_policy_mask_threshold is not None:
        per_token_loss = per_token_loss * off_policy_mask
    if entropy_mask is not None:
        per_token_loss = per_token_loss * entropy_mask
    if weights is not None and objective is not Objective.VESPO:  # vespo folds them into phi
        per_token_loss = per_token_loss * weights
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
        normaliser = mask.sum() if num_items_in_batch is None else logp.new_tensor(float(num_items_in_batch))
        loss = (per_token_loss * mask).sum() / normaliser.clamp(min=1.0)
    elif reduction is Reduction.SEQUENCE_SUM:
        loss = (per_token_loss * mask).sum(-1).mean()
    else:
        raise NotImplementedError(f"reference: no reduction {reduction.value!r}")
    if config.entropy_coef != 0.0:
        effective = mask if entropy_mask is None else mask * entropy_mask
        loss = loss - config.entropy_coef * (entropy * effective).sum() / effective.sum().clamp(min=1.0)

    count = mask.sum().clamp(min=1.0)

    def masked_mean(x):
        return ((x.expand_as(mask) * mask).sum() / count).detach()

    metrics = {}
    if config.beta != 0.0:
        metrics["kl"] = masked_mean(per_token_kl)
    if objective is Objective.CISPO:
        high = ((coef_1 > eps_high) & (adv > 0)).to(logp.dtype)
        low = torch.zeros_like(high)
    elif objective in (Objective.SAPO, Objective.VESPO):  # no clipping: TRL logs no clip ratios
        low = high = torch.zeros_like(mask)
    else:
        low = ((coef_1 < 1 - config.epsilon_low) & (adv < 0)).to(logp.dtype)
        high = ((coef_1 > 1 + eps_high) & (adv > 0)).to(logp.dtype)
    metrics["clip_ratio/low_mean"] = masked_mean(low)
    metrics["clip_ratio/high_mean"] = masked_mean(high)
    metrics["clip_ratio/region_mean"] = masked_mean(torch.clamp(low + high, max=1.0))
    metrics["entropy"] = masked_mean(entropy)
    metrics["logprob_mean"] = masked_mean(logp)
    if weights is not None:
        metrics["is_weight_mean"] = masked_mean(weights)
    return loss, metrics


@torch.no_grad()
def _gamma_weights(adv, log_ratio, mask, is_weights, config: GRPOLossConfig, scalar):
    """VESPO's φ, TRL's `GRPOTrainer.get_gamma_weights` line for line (is_weights: its per-token
    importance_sampling_ratio [B, T], here 0 at padding, so the log-weights are masked; or one ratio per
    sequence [B, 1], added once)."""
    lower_clamp = math.log(1e-8)
    seq_log_ratio = torch.sum(torch.clamp(log_ratio, -20.0, 20.0) * mask, dim=-1, keepdim=True)
    if is_weights is not None:
        log_is_ratio = torch.clamp(torch.log(is_weights), lower_clamp, 20.0)
        if is_weights.shape[-1] != 1 or mask.shape[-1] == 1:  # per token: masked (TRL's are 1 at padding)
            log_is_ratio = log_is_ratio * mask
        # per sequence ([B, 1], TRL's sequence_* modes): log w_b once, as TRL's sum over its last dim
        seq_log_ratio = seq_log_ratio + torch.sum(log_is_ratio, dim=-1, keepdim=True)
    log_w_seq = torch.clamp(seq_log_ratio, lower_clamp, 20.0)
    w_seq = torch.exp(log_w_seq)
    nonneg = adv >= 0
    k = torch.where(nonneg, scalar(config.vespo_k_pos), scalar(config.vespo_k_neg))
    lam = torch.where(nonneg, scalar(config.vespo_lambda_pos), scalar(config.vespo_lambda_neg)).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w_seq - lam * w_seq)
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)

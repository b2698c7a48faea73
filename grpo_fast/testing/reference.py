"""The naive GRPO loss: materialise the `[B, T, V]` logits, log_softmax, gather — what TRL's
`GRPOTrainer._compute_loss` does — with autograd for the gradients. It is the independent oracle
of the tests (run in fp64) and the "naive" baseline of the benchmarks. Padded layout only.
"""

from __future__ import annotations

import torch

from ..loss.loss_types import Reduction
from ..loss.objective import PaddedSequences, SurrogateInputs
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
    rollout_logprobs=None,
):
    """TRL's `_compute_loss` from per-token logprobs and entropies [B, T] (however they were computed): the
    objective's definition (grpo_fast.loss.objectives) on the padded batch, and the loss type's reduction."""
    objective = config.objective_spec
    mask = completion_mask.to(logp.dtype)
    adv = _per_sequence_column(advantages.to(logp.dtype))
    old = logp.detach() if old_logprobs is None else old_logprobs.to(logp.dtype)
    weights = None if is_weights is None else _per_sequence_column(is_weights.to(logp.dtype))
    rollout = None if rollout_logprobs is None else rollout_logprobs.to(logp.dtype)
    log_ratio = logp - old
    if config.importance_sampling_level == "token":
        ratio = torch.exp(log_ratio)
    else:
        ratio = torch.exp(((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1))
    per_sequence = weights is not None and weights.shape[-1] == 1 and mask.shape[-1] != 1
    keep = _kept_tokens(logp, entropy, old, adv, mask, config)
    inside = keep is not None and objective.gates_inside
    inputs = SurrogateInputs(
        ratio, log_ratio, adv, logp, old, rollout, mask * keep if inside else mask, weights, per_sequence,
        PaddedSequences(mask), config, config.options,
    )  # fmt: skip
    surrogate = objective.definition(inputs)
    per_token_loss, low, high = surrogate.per_token, surrogate.low, surrogate.high
    if keep is not None and not inside:
        per_token_loss = per_token_loss * keep
    if weights is not None and not objective.weights_inside:
        per_token_loss = per_token_loss * weights
    if config.beta != 0.0:
        per_token_kl = _k3_kl(logp, ref_logprobs.to(logp.dtype), ratio, config)
        per_token_loss = per_token_loss + config.beta * per_token_kl
    loss = _reduce(per_token_loss, mask, num_items_in_batch, config)
    entropy_mask = _high_entropy_mask(entropy, mask, config)
    if config.entropy_coef != 0.0:
        effective = mask if entropy_mask is None else mask * entropy_mask
        loss = loss - config.entropy_coef * (entropy * effective).sum() / effective.sum().clamp(min=1.0)

    count = mask.sum().clamp(min=1.0)

    def masked_mean(x):
        return ((x.to(logp.dtype).expand_as(mask) * mask).sum() / count).detach()

    def flag_mean(x):  # sequence level: one flag per sequence, TRL's mean of its [B, 1] flags
        if config.importance_sampling_level == "token":
            return masked_mean(x)
        per_sequence = (x.to(logp.dtype).expand_as(mask) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_sequence.mean().detach()

    metrics = {}
    if config.beta != 0.0:
        metrics["kl"] = masked_mean(per_token_kl)
    metrics["clip_ratio/low_mean"] = flag_mean(low)
    metrics["clip_ratio/high_mean"] = flag_mean(high)
    metrics["clip_ratio/region_mean"] = flag_mean(low | high)
    metrics["entropy"] = masked_mean(entropy)
    metrics["logprob_mean"] = masked_mean(logp)
    if weights is not None:
        metrics["is_weight_mean"] = masked_mean(weights)
    if objective.masks_tokens:
        metrics["trust_region/masked_mean"] = masked_mean(surrogate.masked)
    return loss, metrics


def _per_sequence_column(x: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, 1] (one value per sequence, broadcast over its tokens); [B, T] as is."""
    return x.unsqueeze(1) if x.dim() == 1 else x


def _high_entropy_mask(entropy, mask, config: GRPOLossConfig):
    """TRL's get_high_entropy_mask (one process), or None when top_entropy_quantile is off."""
    if config.top_entropy_quantile >= 1.0:
        return None
    local = entropy.detach()[mask.bool()].float()
    if local.numel() == 0:
        return torch.zeros_like(mask, dtype=torch.bool)
    threshold = torch.quantile(local, 1 - config.top_entropy_quantile)
    return (entropy.detach() * mask >= threshold) & mask.bool()


def _kept_tokens(logp, entropy, old, adv, mask, config: GRPOLossConfig):
    """The product of TRL's off-policy mask (against the old logprobs) and its entropy mask; None when both are
    off."""
    keep = _high_entropy_mask(entropy, mask, config)
    if config.off_policy_mask_threshold is not None:  # TRL's get_off_policy_mask
        kl_div = torch.nan_to_num(old - logp.detach(), nan=0.0)
        avg_seq_kl = (kl_div * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
        off_policy = ((adv >= 0) | (avg_seq_kl <= config.off_policy_mask_threshold)).to(mask.dtype)
        keep = off_policy if keep is None else off_policy * keep
    return keep


def _k3_kl(logp, ref, ratio, config: GRPOLossConfig):
    """exp(r − ℓ) − (r − ℓ) − 1, times the ratio with use_bias_correction_kl."""
    kl = torch.exp(ref - logp) - (ref - logp) - 1
    return kl * ratio if config.use_bias_correction_kl else kl


def _reduce(per_token_loss, mask, num_items_in_batch, config: GRPOLossConfig):
    """The loss type's reduction of the masked per-token losses [B, T]."""
    reduction = config.loss_spec.reduction
    batch, length = mask.shape
    if reduction is Reduction.SEQUENCE_MEAN:
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if reduction is Reduction.TOKEN_MEAN:
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if reduction is Reduction.CONSTANT_LENGTH:
        return (per_token_loss * mask).sum() / (batch * (config.max_completion_length or length))
    if reduction is Reduction.GLOBAL_TOKEN_MEAN:
        normaliser = mask.sum() if num_items_in_batch is None else per_token_loss.new_tensor(float(num_items_in_batch))
        return (per_token_loss * mask).sum() / normaliser.clamp(min=1.0)
    if reduction is Reduction.SEQUENCE_SUM:
        return (per_token_loss * mask).sum(-1).mean()
    raise NotImplementedError(f"reference: no reduction {reduction.value!r}")

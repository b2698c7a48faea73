"""Layer 2 of the loss: the O(N) GRPO token math, in PyTorch (the twin of kernels/grpo_token_loss.py).

The loss type (grpo_fast.loss.loss_types) picks the objective (clipped or cispo) and the reduction
weights c_i.

Notation, per token i of sequence b (flat rows, see grpo_fast.loss.layout):
  ℓ_i current logprob, o_i old logprob, r_i reference logprob, A_i advantage, w_i importance weight,
  H_i entropy, m_i mask, L_b = Σ_{i∈b} m_i.
  c_i = reduction weight of the loss type (mask folded in, see `reduction_weights`),
  e_i = m_i / max(Σ m, 1) (the entropy bonus is a masked mean, whatever the loss type, as in TRL).

  s_i = ℓ_i − o_i                                (token level)
  s_i = s_b = Σ_{j∈b} m_j (ℓ_j − o_j) / max(L_b, 1)   (sequence level, GSPO)
  ρ_i = exp(s_i)
  clipped:      t1 = min(ρ, δ) (δ optional), t2 = clip(ρ, 1 − ε_lo, 1 + ε_hi), p_i = −min(t1 A, t2 A)
  cispo:        p_i = −sg(min(ρ, ε_hi)) A ℓ_i
  kl_i = exp(r_i − ℓ_i) − (r_i − ℓ_i) − 1        (k3 estimator)

  L = Σ_i c_i (w_i p_i + β kl_i) − entropy_coef Σ_i e_i H_i

Gradients handed to layer 1 (gℓ = ∂L/∂ℓ, gH = ∂L/∂H):
  ∂p/∂s = −A ∂t/∂s with t the branch the min picks; ∂t1/∂s = ρ [ρ ≤ δ], ∂t2/∂s = ρ [1−ε_lo ≤ ρ ≤ 1+ε_hi]
  token level:    gℓ_i = c_i w_i ∂p_i/∂s_i + β c_i (1 − exp(r_i − ℓ_i))
  sequence level: gℓ_j = m_j / max(L_b, 1) · Σ_{i∈b} c_i w_i ∂p_i/∂s_b + β c_j (1 − exp(r_j − ℓ_j))
  cispo:          gℓ_i = −c_i w_i min(ρ_i, ε_hi) A_i + β c_i (1 − exp(r_i − ℓ_i))
  gH_i = −entropy_coef e_i
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import TokenLayout
from .loss_types import Objective, Reduction
from .options import GRPOLossConfig

# Order of the partial sums in `TokenLossOutput.sums` (chunks add them up).
SUM_NAMES = ("loss", "kl", "clip_low", "clip_high", "clip_region", "entropy", "logprob", "is_weight")


@dataclass(frozen=True)
class TokenInputs:
    """Per-token inputs of layer 2, all flat `[N]` fp32 (None where the option is off)."""

    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    advantages: torch.Tensor
    is_weights: torch.Tensor | None
    loss_weights: torch.Tensor
    entropy_weights: torch.Tensor


@dataclass(frozen=True)
class TokenLossOutput:
    """sums: [len(SUM_NAMES)] fp32 — the loss and the masked metric sums of these rows.
    grad_logprobs: [R] ∂L/∂ℓ.  grad_entropy: [R] ∂L/∂H, or None when entropy_coef == 0."""

    sums: torch.Tensor
    grad_logprobs: torch.Tensor
    grad_entropy: torch.Tensor | None


def reduction_weights(
    layout: TokenLayout, config: GRPOLossConfig, num_items_in_batch: float | torch.Tensor | None
) -> torch.Tensor:
    """c [N]: the coefficient of each token's loss in the reduction of `config.loss_type` (TRL's)."""
    mask = layout.mask
    reduction = config.loss_spec.reduction
    if reduction is Reduction.SEQUENCE_MEAN:
        per_seq = layout.active_per_seq.clamp(min=1.0) * layout.num_seqs
        return mask / per_seq[layout.seq_index]
    if reduction is Reduction.CONSTANT_LENGTH:
        length = config.max_completion_length or layout.padded_length
        return mask / float(layout.num_seqs * max(length, 1))
    if reduction is Reduction.GLOBAL_TOKEN_MEAN and num_items_in_batch is not None:
        count = torch.as_tensor(num_items_in_batch, dtype=mask.dtype, device=mask.device)
        return mask / count.clamp(min=1.0)
    if reduction in (Reduction.TOKEN_MEAN, Reduction.GLOBAL_TOKEN_MEAN):  # the latter without a global count
        return mask / mask.sum().clamp(min=1.0)
    raise NotImplementedError(f"loss_type {config.loss_type!r}: no token weights for reduction {reduction.value!r}")


def entropy_weights(layout: TokenLayout) -> torch.Tensor:
    """e [N] = m / max(Σ m, 1): weights of the masked-mean entropy (bonus and metric)."""
    return layout.mask / layout.mask.sum().clamp(min=1.0)


def grpo_token_loss(
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    inputs: TokenInputs,
    layout: TokenLayout,
    config: GRPOLossConfig,
    rows: slice = slice(None),
) -> TokenLossOutput:
    """Loss, metric sums and (gℓ, gH) for the token rows `rows` (whole sequences at sequence level).

    logprobs, entropy: [R] fp32 for those rows (entropy may be None when entropy_coef == 0).
    """
    mask = layout.mask[rows]
    adv = inputs.advantages[rows]
    c = inputs.loss_weights[rows]
    old = logprobs.detach() if inputs.old_logprobs is None else inputs.old_logprobs[rows]
    weight = torch.ones_like(c) if inputs.is_weights is None else inputs.is_weights[rows]

    log_ratio = logprobs - old
    if config.importance_sampling_level == "sequence":
        seq = layout.seq_index[rows]
        seq_len = layout.active_per_seq.clamp(min=1.0)
        seq_log_ratio = layout.seq_sum(log_ratio * mask, seq) / seq_len
        log_ratio = seq_log_ratio[seq]
    ratio = torch.exp(log_ratio)

    objective = config.loss_spec.objective
    if objective is Objective.CISPO:
        capped = torch.clamp(ratio, max=config.clip_high)
        per_token = -capped * adv * logprobs
        d_logp = c * weight * (-capped * adv)
        high = (ratio > config.clip_high) & (adv > 0)
        low = torch.zeros_like(high)
    elif objective is Objective.CLIPPED:
        lo, hi = 1.0 - config.epsilon_low, 1.0 + config.clip_high
        t1 = ratio if config.delta is None else torch.clamp(ratio, max=config.delta)
        t2 = torch.clamp(ratio, lo, hi)
        dt1 = ratio if config.delta is None else ratio * (ratio <= config.delta)
        dt2 = ratio * ((ratio >= lo) & (ratio <= hi))
        first = t1 * adv <= t2 * adv
        per_token = -torch.minimum(t1 * adv, t2 * adv)
        d_ratio = c * weight * (-adv * torch.where(first, dt1, dt2))
        if config.importance_sampling_level == "sequence":
            d_seq = layout.seq_sum(d_ratio, seq) / seq_len
            d_logp = mask * d_seq[seq]
        else:
            d_logp = d_ratio
        low = (ratio < lo) & (adv < 0)
        high = (ratio > hi) & (adv > 0)
    else:
        raise NotImplementedError(f"loss_type {config.loss_type!r}: no token math for objective {objective.value!r}")

    loss_terms = c * weight * per_token
    kl = None
    if config.beta != 0.0:
        # Padding rows get ref − ℓ = 0 (kl = 0) so that exp cannot overflow where c = 0.
        ref_gap = torch.where(mask > 0, inputs.ref_logprobs[rows] - logprobs, torch.zeros_like(logprobs))
        kl = torch.exp(ref_gap) - ref_gap - 1.0
        loss_terms = loss_terms + config.beta * c * kl
        d_logp = d_logp + config.beta * c * (1.0 - torch.exp(ref_gap))

    e = inputs.entropy_weights[rows]
    grad_entropy = None
    loss = loss_terms.sum()
    if config.entropy_coef != 0.0:
        loss = loss - config.entropy_coef * (e * entropy).sum()
        grad_entropy = -config.entropy_coef * e

    zero = logprobs.new_zeros(())
    sums = torch.stack(
        [
            loss,
            zero if kl is None else (mask * kl).sum(),
            (mask * low).sum(),
            (mask * high).sum(),
            (mask * (low | high)).sum(),
            zero if entropy is None else (mask * entropy).sum(),
            (mask * logprobs).sum(),
            (mask * weight).sum(),
        ]
    )
    return TokenLossOutput(sums.detach(), d_logp.detach(), grad_entropy)


def finalize_metrics(
    sums: torch.Tensor, layout: TokenLayout, config: GRPOLossConfig, has_is_weights: bool
) -> dict[str, torch.Tensor]:
    """Masked means from the summed partials (TRL's metric names), as detached 0-dim tensors."""
    values = dict(zip(SUM_NAMES, sums.unbind(0), strict=True))
    count = layout.mask.sum().clamp(min=1.0)
    metrics = {}
    if config.beta != 0.0:
        metrics["kl"] = values["kl"] / count
    metrics["clip_ratio/low_mean"] = values["clip_low"] / count
    metrics["clip_ratio/high_mean"] = values["clip_high"] / count
    metrics["clip_ratio/region_mean"] = values["clip_region"] / count
    metrics["entropy"] = values["entropy"] / count
    metrics["logprob_mean"] = values["logprob"] / count
    if has_is_weights:
        metrics["is_weight_mean"] = values["is_weight"] / count
    return metrics

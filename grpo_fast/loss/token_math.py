"""Layer 2 of the loss: the O(N) GRPO token math, in PyTorch (the twin of kernels/grpo_token_loss.py).

The loss type (grpo_fast.loss.loss_types) picks the objective (clipped, cispo, sapo or vespo) and the
reduction weights c_i.

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
  sapo:         p_i = −(4/τ_i) σ(τ_i (ρ_i − 1)) A_i,  τ_i = τ_pos if A_i > 0 else τ_neg
  vespo:        p_i = −sg(φ_i) A_i ℓ_i,  φ_i = exp(λ_i + k_i log W_b − λ_i W_b) (0 if it overflows),
                log W_b = clamp(Σ_{j∈b} m_j (clamp(ℓ_j − o_j, −20, 20) + clamp(log w_j, log 1e-8, 20)), log 1e-8, 20)
                (the log w term only with importance weights; weights given per sequence, [B], enter once:
                clamp(log w_b) instead of the sum over tokens), (k_i, λ_i) = (k_pos, max(λ_pos, 1e-4)) if
                A_i ≥ 0 else the _neg pair; vespo's w_i enter W_b only, so its v_i = 1 below (v_i = w_i otherwise)
  kl_i = exp(r_i − ℓ_i) − (r_i − ℓ_i) − 1        (k3 estimator)
  κ_i = kl_i ρ_i with use_bias_correction_kl, kl_i otherwise (ρ differentiable, before δ)

  L = Σ_i c_i (v_i p_i + β κ_i) − entropy_coef Σ_i e_i H_i

Gradients handed to layer 1 (gℓ = ∂L/∂ℓ, gH = ∂L/∂H), split into a part through ℓ_i directly (d_i) and a
part through s_i (q_i = ∂L/∂s_i, which at sequence level reaches every token of the sequence):
  ∂p/∂s: clipped −A ∂t/∂s with t the branch the min picks, ∂t1/∂s = ρ [ρ ≤ δ], ∂t2/∂s = ρ [1−ε_lo ≤ ρ ≤ 1+ε_hi];
         sapo −4 A σ_i (1 − σ_i) ρ_i with σ_i = σ(τ_i (ρ_i − 1)); cispo, vespo 0 (their ratio is detached)
  ∂p/∂ℓ directly: cispo −min(ρ, ε_hi) A; vespo −φ A; clipped, sapo 0
  d_i = c_i v_i ∂p_i/∂ℓ_i + β c_i (1 − exp(r_i − ℓ_i)) (· ρ_i with bias correction)
  q_i = c_i v_i ∂p_i/∂s_i (+ β c_i kl_i ρ_i with bias correction)
  token level:    gℓ_i = d_i + q_i
  sequence level: gℓ_j = d_j + m_j / max(L_b, 1) · Σ_{i∈b} q_i
  gH_i = −entropy_coef e_i
"""

from __future__ import annotations

import math
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
    is_weights_per_sequence: bool = False
    """Whether `is_weights` came as one weight per sequence ([B] / [B, 1], broadcast over its tokens here):
    vespo then adds log w_b once per sequence to log W_b (TRL's sequence-level ratio), not once per token."""


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
    if reduction is Reduction.SEQUENCE_SUM:
        return mask / float(max(layout.num_seqs, 1))
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


@dataclass(frozen=True)
class ObjectiveInputs:
    """What an objective's token math reads, for the rows of one call ([R] each): ratio ρ, advantages A,
    logprobs ℓ, reduction weights c, policy weights w·g (importance weight times TRL's masks), the masks g alone
    (None when off), token log-ratios ℓ − o, and for whole-sequence terms the layout and the rows' sequences."""

    ratio: torch.Tensor
    advantages: torch.Tensor
    logprobs: torch.Tensor
    c: torch.Tensor
    policy_weight: torch.Tensor
    gate: torch.Tensor | None
    token_log_ratio: torch.Tensor
    inputs: TokenInputs
    layout: TokenLayout
    seq: torch.Tensor | None
    rows: slice
    config: GRPOLossConfig


ObjectiveTerms = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""(c v p, d, q, low, high) [R]: the weighted loss terms, the direct gradient part d_i = c_i v_i ∂p_i/∂ℓ_i, the
part through the ratio q_i = c_i v_i ∂p_i/∂s_i, and the clip flags (bool)."""


def _clipped_terms(x: ObjectiveInputs) -> ObjectiveTerms:
    config, ratio, adv = x.config, x.ratio, x.advantages
    lo, hi = 1.0 - config.epsilon_low, 1.0 + config.clip_high
    t1 = ratio if config.delta is None else torch.clamp(ratio, max=config.delta)
    t2 = torch.clamp(ratio, lo, hi)
    dt1 = ratio if config.delta is None else ratio * (ratio <= config.delta)
    dt2 = ratio * ((ratio >= lo) & (ratio <= hi))
    first = t1 * adv <= t2 * adv
    per_token = -torch.minimum(t1 * adv, t2 * adv)
    d_ratio = x.c * x.policy_weight * (-adv * torch.where(first, dt1, dt2))
    low, high = (ratio < lo) & (adv < 0), (ratio > hi) & (adv > 0)
    return x.c * x.policy_weight * per_token, torch.zeros_like(x.c), d_ratio, low, high


def _cispo_terms(x: ObjectiveInputs) -> ObjectiveTerms:
    capped = torch.clamp(x.ratio, max=x.config.clip_high)
    per_token = -capped * x.advantages * x.logprobs
    d_logp = x.c * x.policy_weight * (-capped * x.advantages)
    high = (x.ratio > x.config.clip_high) & (x.advantages > 0)
    return x.c * x.policy_weight * per_token, d_logp, torch.zeros_like(x.c), torch.zeros_like(high), high


def _sapo_terms(x: ObjectiveInputs) -> ObjectiveTerms:
    config, adv, c = x.config, x.advantages, x.c
    tau = torch.where(adv > 0, c.new_tensor(config.sapo_temperature_pos), c.new_tensor(config.sapo_temperature_neg))
    sig = torch.sigmoid(tau * (x.ratio - 1.0))
    per_token = -(4.0 / tau) * sig * adv
    d_ratio = c * x.policy_weight * (-4.0 * adv * sig * (1.0 - sig) * x.ratio)
    none = torch.zeros_like(adv, dtype=torch.bool)
    return c * x.policy_weight * per_token, torch.zeros_like(c), d_ratio, none, none


def _vespo_terms(x: ObjectiveInputs) -> ObjectiveTerms:
    inputs = x.inputs
    mask = x.layout.mask[x.rows]
    phi = vespo_weights(
        x.token_log_ratio, inputs.is_weights, x.advantages, mask, x.seq, x.layout, x.config, x.rows,
        inputs.is_weights_per_sequence,
    )  # fmt: skip
    per_token = -phi * x.advantages * x.logprobs
    v = torch.ones_like(x.c) if x.gate is None else x.gate  # vespo's importance weights are inside φ
    none = torch.zeros_like(mask, dtype=torch.bool)
    return x.c * v * per_token, x.c * v * (-phi * x.advantages), torch.zeros_like(x.c), none, none


TOKEN_TERMS = {
    Objective.CLIPPED: _clipped_terms,
    Objective.CISPO: _cispo_terms,
    Objective.SAPO: _sapo_terms,
    Objective.VESPO: _vespo_terms,
}
"""Each objective's token math (the formulas of the module docstring)."""


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

    token_log_ratio = logprobs - old
    log_ratio = token_log_ratio
    sequence_level = config.importance_sampling_level == "sequence"
    seq = layout.seq_index[rows] if config.needs_whole_sequences else None
    if sequence_level:
        seq_len = layout.active_per_seq.clamp(min=1.0)
        log_ratio = (layout.seq_sum(token_log_ratio * mask, seq) / seq_len)[seq]
    ratio = torch.exp(log_ratio)

    gate, e = _token_masks(logprobs, entropy, old, adv, mask, seq, layout, config, rows)
    e = inputs.entropy_weights[rows] if e is None else e
    policy_weight = weight if gate is None else weight * gate
    objective = config.loss_spec.objective
    if objective not in TOKEN_TERMS:
        raise NotImplementedError(f"loss_type {config.loss_type!r}: no token math for objective {objective.value!r}")
    x = ObjectiveInputs(
        ratio, adv, logprobs, c, policy_weight, gate, token_log_ratio, inputs, layout, seq, rows, config
    )
    loss_terms, d_logp, d_ratio, low, high = TOKEN_TERMS[objective](x)
    kl = None
    if config.beta != 0.0:
        # Padding rows get ref − ℓ = 0 (kl = 0) so that exp cannot overflow where c = 0.
        ref_gap = torch.where(mask > 0, inputs.ref_logprobs[rows] - logprobs, torch.zeros_like(logprobs))
        kl = torch.exp(ref_gap) - ref_gap - 1.0
        d_kl = 1.0 - torch.exp(ref_gap)
        if config.use_bias_correction_kl:  # κ = kl ρ: ∂κ/∂ℓ = ρ ∂kl/∂ℓ directly, + kl ρ through s
            d_kl = d_kl * ratio
            d_ratio = d_ratio + config.beta * c * kl * ratio
            kl = kl * ratio
        loss_terms = loss_terms + config.beta * c * kl
        d_logp = d_logp + config.beta * c * d_kl
    if sequence_level:
        d_logp = d_logp + mask * (layout.seq_sum(d_ratio, seq) / seq_len)[seq]
    else:
        d_logp = d_logp + d_ratio

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


def _token_masks(logprobs, entropy, old, adv, mask, seq, layout, config: GRPOLossConfig, rows: slice):
    """(g [R] | None, e [R] | None): which tokens keep their policy term under TRL's off-policy and entropy masks
    (None: all), and the entropy weights when the entropy mask changes them (the bonus acts on the same tokens,
    TRL's effective_mask)."""
    gate = entropy_weights_of_top = None
    if config.off_policy_mask_threshold is not None:
        gate = off_policy_keep(logprobs, old, adv, mask, seq, layout, config.off_policy_mask_threshold)
    if config.top_entropy_quantile < 1.0:
        if rows != slice(None) and (rows.start not in (None, 0) or rows.stop not in (None, layout.num_tokens)):
            raise ValueError("top_entropy_quantile: the entropy quantile needs every row of the call at once")
        top = high_entropy_mask(entropy, mask, config.top_entropy_quantile)
        gate = top if gate is None else gate * top
        entropy_weights_of_top = top / top.sum().clamp(min=1.0)
    return gate, entropy_weights_of_top


def high_entropy_mask(entropy: torch.Tensor | None, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """1.0 where a token is active and its entropy is at least the (1 − top_quantile) quantile of the active
    tokens' entropies (fp32, linear interpolation), else 0.0 — TRL's `get_high_entropy_mask` over this call's
    tokens (TRL: one micro-batch, across processes)."""
    if entropy is None:
        raise ValueError("top_entropy_quantile: needs the entropies")
    active = mask > 0
    values = entropy.detach()[active].float()
    if values.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(values, 1.0 - top_quantile)
    return ((entropy.detach() * mask >= threshold) & active).to(mask.dtype)


def off_policy_keep(
    logprobs: torch.Tensor,
    old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    seq: torch.Tensor,
    layout: TokenLayout,
    threshold: float,
) -> torch.Tensor:
    """1.0 where a token keeps its policy term under off-policy sequence masking (DeepSeek-V3.2, TRL's
    `get_off_policy_mask`): A_i ≥ 0, or its sequence's mean KL estimate Σ m (o − sg(ℓ)) / max(L_b, 1) is at
    most `threshold`; 0.0 otherwise (whole sequences; `seq` the rows' sequence index)."""
    kl = torch.nan_to_num(old - logprobs.detach(), nan=0.0)
    seq_kl = layout.seq_sum(kl * mask, seq) / layout.active_per_seq.clamp(min=1.0)
    return ((advantages >= 0) | (seq_kl[seq] <= threshold)).to(mask.dtype)


def vespo_weights(
    token_log_ratio: torch.Tensor,
    is_weights: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    seq: torch.Tensor,
    layout: TokenLayout,
    config: GRPOLossConfig,
    rows: slice = slice(None),
    per_sequence: bool = False,
) -> torch.Tensor:
    """φ [R] (detached) of vespo for rows `rows` (whole sequences; `seq` their sequence index), from the
    token log-ratios ℓ − o [R], importance weights (all N rows, or None), advantages and mask [R]:
    φ_i = exp(λ_i + k_i log W_b − λ_i W_b), 0 where that overflows (TRL's `get_gamma_weights`).
    per_sequence: the weights are one per sequence broadcast over its tokens; clamp(log w_b) then enters
    log W_b once (as m_i / L_b per token), as TRL's [B, 1] sequence ratio does."""
    log_floor = math.log(1e-8)
    log_terms = torch.clamp(token_log_ratio.detach(), -20.0, 20.0)
    if is_weights is not None:  # log(0) = −inf (TRL's token_mask) clamps to log 1e-8
        log_is = torch.clamp(torch.log(is_weights[rows]), log_floor, 20.0)
        if per_sequence:
            log_is = log_is / layout.active_per_seq.clamp(min=1.0)[seq]
        log_terms = log_terms + log_is
    log_w = torch.clamp(layout.seq_sum(mask * log_terms, seq), log_floor, 20.0)[seq]
    nonneg = advantages >= 0
    k_pos, k_neg = (log_w.new_tensor(config.vespo_k_pos), log_w.new_tensor(config.vespo_k_neg))
    lam_pos, lam_neg = (log_w.new_tensor(max(lam, 1e-4)) for lam in (config.vespo_lambda_pos, config.vespo_lambda_neg))
    k, lam = torch.where(nonneg, k_pos, k_neg), torch.where(nonneg, lam_pos, lam_neg)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return torch.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0)


def finalize_metrics(
    sums: torch.Tensor, active_tokens: torch.Tensor, config: GRPOLossConfig, has_is_weights: bool
) -> dict[str, torch.Tensor]:
    """Masked means from the summed partials [len(SUM_NAMES)] over `active_tokens` (0-dim, the layout's
    mask sum) under TRL's metric names, as detached 0-dim tensors."""
    values = dict(zip(SUM_NAMES, sums.unbind(0), strict=True))
    count = active_tokens.clamp(min=1.0)
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

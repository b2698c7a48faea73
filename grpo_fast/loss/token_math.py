"""Layer 2 of the loss: the O(N) GRPO token math in PyTorch (kernels/grpo_token_loss.py is a Triton twin of the
built-in objectives).

Notation, per token i of sequence b (flat rows, see grpo_fast.loss.layout):
  ℓ_i current logprob, o_i old logprob, r_i reference logprob, A_i advantage, w_i importance weight,
  H_i entropy, m_i mask, L_b = Σ_{i∈b} m_i.
  c_i = reduction weight of the loss type (mask folded in, see `reduction_weights`),
  e_i = m_i / max(Σ m, 1) (the entropy bonus is a masked mean, whatever the loss type, as in TRL).

  s_i = ℓ_i − o_i                                       (token level)
  s_i = s_b = Σ_{j∈b} m_j (ℓ_j − o_j) / max(L_b, 1)     (sequence level, GSPO)
  ρ_i = exp(s_i)
  p_i = the objective's per-token surrogate (its `definition`, grpo_fast.loss.objectives), times TRL's token masks
        g_i (off-policy and entropy masks) and, unless the objective takes them inside, the weights w_i
  kl_i = exp(r_i − ℓ_i) − (r_i − ℓ_i) − 1              (k3 estimator)
  κ_i = kl_i ρ_i with use_bias_correction_kl, kl_i otherwise (ρ differentiable, before δ)

  L = Σ_i c_i (p_i + β κ_i) − entropy_coef Σ_i e_i H_i

The gradients handed to layer 1, gℓ = ∂L/∂ℓ and gH = ∂L/∂H, are autograd over these O(N) terms (`token_terms`):
the objective's definition is the only statement of its math. At sequence level ∂L/∂ℓ_j reaches every token of
the sequence through s_b (m_j / L_b · Σ_{i∈b} ∂L/∂s_i), which autograd gives from the same definition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .layout import TokenLayout
from .loss_types import Reduction
from .objective import RowSequences, SurrogateInputs
from .options import GRPOLossConfig

# Order of the partial sums in `TokenLossOutput.sums` (chunks add them up).
SUM_NAMES = ("loss", "kl", "clip_low", "clip_high", "clip_region", "entropy", "logprob", "is_weight", "masked")


@dataclass(frozen=True)
class TokenInputs:
    """Per-token inputs of layer 2, all flat `[N]` in the accumulation dtype (None where the option is off)."""

    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    advantages: torch.Tensor
    is_weights: torch.Tensor | None
    loss_weights: torch.Tensor
    entropy_weights: torch.Tensor
    is_weights_per_sequence: bool = False
    """Whether `is_weights` came as one weight per sequence ([B] / [B, 1], broadcast over its tokens here):
    vespo then adds log w_b once per sequence to log W_b (TRL's sequence-level ratio), not once per token."""
    rollout_logprobs: torch.Tensor | None = None
    """The inference engine's logprobs of the sampled tokens, for an objective that needs them (else None)."""


@dataclass(frozen=True)
class TokenLossOutput:
    """sums: [len(SUM_NAMES)] — the loss and the masked metric sums of these rows.
    grad_logprobs: [R] ∂L/∂ℓ.  grad_entropy: [R] ∂L/∂H, or None when entropy_coef == 0."""

    sums: torch.Tensor
    grad_logprobs: torch.Tensor
    grad_entropy: torch.Tensor | None


class TokenTerms(NamedTuple):
    """loss: [] L of these rows, differentiable w.r.t. the logprobs and entropies it was given.
    sums: [len(SUM_NAMES)] the loss and the masked metric sums (detached)."""

    loss: torch.Tensor
    sums: torch.Tensor


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
        length = config.max_completion_length or layout.padded_width
        if length is not None:
            return mask / float(layout.num_seqs * max(length, 1))
        return mask / (layout.num_seqs * layout.longest_sequence().clamp(min=1)).to(mask.dtype)
    if reduction is Reduction.GLOBAL_TOKEN_MEAN and num_items_in_batch is not None:
        count = torch.as_tensor(num_items_in_batch, dtype=mask.dtype, device=mask.device)
        return mask / count.clamp(min=1.0)
    if reduction in (Reduction.TOKEN_MEAN, Reduction.GLOBAL_TOKEN_MEAN):  # the latter without a global count
        return mask / mask.sum().clamp(min=1.0)
    raise NotImplementedError(f"loss_type {config.loss_type!r}: no token weights for reduction {reduction.value!r}")


def entropy_weights(layout: TokenLayout) -> torch.Tensor:
    """e [N] = m / max(Σ m, 1): weights of the masked-mean entropy (bonus and metric)."""
    return layout.mask / layout.mask.sum().clamp(min=1.0)


def covers_all(rows: slice, layout: TokenLayout) -> bool:
    """Whether `rows` are all N rows of the layout."""
    return rows == slice(None) or (rows.start in (None, 0) and rows.stop in (None, layout.num_tokens))


def grpo_token_loss(
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    inputs: TokenInputs,
    layout: TokenLayout,
    config: GRPOLossConfig,
    rows: slice = slice(None),
) -> TokenLossOutput:
    """Loss, metric sums and (gℓ, gH) for the token rows `rows` (whole sequences where the config needs them),
    the gradients by autograd over `token_terms`.

    logprobs, entropy: [R] for those rows (entropy may be None when entropy_coef == 0 and no mask reads it).
    """
    logp = logprobs.detach().requires_grad_()
    entropy_leaf = None if entropy is None else entropy.detach().requires_grad_(config.entropy_coef != 0.0)
    with torch.enable_grad():
        terms = token_terms(logp, entropy_leaf, inputs, layout, config, rows)
        wrt = [logp] if config.entropy_coef == 0.0 else [logp, entropy_leaf]
        grads = torch.autograd.grad(terms.loss, wrt, allow_unused=True) if terms.loss.requires_grad else [None] * 2
    grad_logp = torch.zeros_like(logp) if grads[0] is None else grads[0]
    grad_entropy = None
    if config.entropy_coef != 0.0:
        grad_entropy = torch.zeros_like(logp) if grads[1] is None else grads[1]
    return TokenLossOutput(terms.sums, grad_logp.detach(), grad_entropy)


def token_terms(
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    inputs: TokenInputs,
    layout: TokenLayout,
    config: GRPOLossConfig,
    rows: slice = slice(None),
) -> TokenTerms:
    """L of the rows `rows` (the module docstring's formula), differentiable w.r.t. `logprobs` and `entropy` [R],
    and its metric sums."""
    objective = config.objective_spec
    mask = layout.mask[rows]
    adv = inputs.advantages[rows]
    c = inputs.loss_weights[rows]
    old = logprobs.detach() if inputs.old_logprobs is None else inputs.old_logprobs[rows]
    weights = None if inputs.is_weights is None else inputs.is_weights[rows]
    rollout = None if inputs.rollout_logprobs is None else inputs.rollout_logprobs[rows]
    whole = config.needs_whole_sequences or covers_all(rows, layout)
    sequences = RowSequences(layout.seq_index[rows], layout.num_seqs, layout.active_per_seq, whole, objective.name)

    token_log_ratio = logprobs - old
    if config.importance_sampling_level == "sequence":
        ratio = torch.exp(sequences.mean(token_log_ratio, mask))
    else:
        ratio = torch.exp(token_log_ratio)
    gate, e = _token_masks(logprobs.detach(), entropy, old, adv, mask, sequences, config, rows, layout)
    inside = gate is not None and objective.gates_inside
    x = SurrogateInputs(
        ratio, token_log_ratio, adv, logprobs, old, rollout, mask * gate if inside else mask, weights,
        inputs.is_weights_per_sequence, sequences, config, config.options,
    )  # fmt: skip
    surrogate = objective.definition(x)
    per_token = surrogate.per_token
    if gate is not None and not inside:
        per_token = per_token * gate
    if weights is not None and not objective.weights_inside:
        per_token = per_token * weights
    loss_terms = c * per_token
    kl = None
    if config.beta != 0.0:
        # Padding rows get ref − ℓ = 0 (kl = 0) so that exp cannot overflow where c = 0.
        ref_gap = torch.where(mask > 0, inputs.ref_logprobs[rows] - logprobs, torch.zeros_like(logprobs))
        kl = torch.exp(ref_gap) - ref_gap - 1.0
        if config.use_bias_correction_kl:  # κ = kl ρ (ρ before δ)
            kl = kl * ratio
        loss_terms = loss_terms + config.beta * c * kl
    loss = loss_terms.sum()
    if config.entropy_coef != 0.0:
        e = inputs.entropy_weights[rows] if e is None else e
        loss = loss - config.entropy_coef * (e * entropy).sum()
    # the clip flags at sequence level are one per sequence: each sequence's tokens count 1 in all (TRL's metric)
    per_flag = mask / sequences.length if config.importance_sampling_level == "sequence" else mask
    return TokenTerms(loss, _sums(loss, kl, surrogate, mask, per_flag, entropy, logprobs, weights))


def _sums(loss, kl, surrogate, mask, per_flag, entropy, logprobs, weights) -> torch.Tensor:
    """[len(SUM_NAMES)]: the loss and the masked metric sums, detached (weights 1 where absent); the clip flags
    summed with the weights `per_flag`."""
    low, high = surrogate.low, surrogate.high
    zero = loss.new_zeros(())

    def masked_sum(values, weights=mask):
        return zero if values is None else (weights * values.detach()).sum()

    return torch.stack(
        [
            loss.detach(),
            masked_sum(kl),
            masked_sum(low, per_flag),
            masked_sum(high, per_flag),
            masked_sum(low | high, per_flag),
            masked_sum(entropy),
            masked_sum(logprobs),
            masked_sum(weights) if weights is not None else mask.sum(),
            masked_sum(surrogate.masked),
        ]
    )


def _token_masks(logprobs, entropy, old, adv, mask, sequences, config: GRPOLossConfig, rows: slice, layout):
    """(g [R] | None, e [R] | None): which tokens keep their policy term under TRL's off-policy and entropy masks
    (None: all), and the entropy weights when the entropy mask changes them (the bonus acts on the same tokens,
    TRL's effective_mask)."""
    gate = entropy_weights_of_top = None
    if config.off_policy_mask_threshold is not None:
        gate = off_policy_keep(logprobs, old, adv, mask, sequences, config.off_policy_mask_threshold)
    if config.top_entropy_quantile < 1.0:
        if not covers_all(rows, layout):
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
    threshold = _active_quantile(entropy.detach().float(), active, 1.0 - top_quantile)
    return ((entropy.detach() * mask >= threshold) & active).to(mask.dtype)


def _active_quantile(values: torch.Tensor, active: torch.Tensor, q: float) -> torch.Tensor:
    """torch.quantile(values[active], q) (linear interpolation between the sorted values, as torch computes it),
    without selecting the active values (static shapes: traceable); +inf when none is active."""
    if values.numel() == 0:  # a static shape: no rows at all
        return values.new_full((), float("inf"))
    ordered = torch.sort(torch.where(active, values, torch.full_like(values, float("inf")))).values
    count = active.sum()
    rank = (count - 1).clamp(min=0).to(values.dtype) * q
    below = rank.to(torch.int64)
    above = torch.minimum(rank.ceil().to(torch.int64), (count - 1).clamp(min=0))
    at_below, at_above = (ordered.gather(0, index.reshape(1)) for index in (below, above))  # no host read
    lerped = torch.lerp(at_below, at_above, rank - below.to(values.dtype)).reshape(())
    return torch.where(count > 0, lerped, torch.full_like(lerped, float("inf")))


def off_policy_keep(
    logprobs: torch.Tensor,
    old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    sequences: RowSequences,
    threshold: float,
) -> torch.Tensor:
    """1.0 where a token keeps its policy term under off-policy sequence masking (DeepSeek-V3.2, TRL's
    `get_off_policy_mask`): A_i ≥ 0, or its sequence's mean KL estimate Σ m (o − sg(ℓ)) / max(L_b, 1) is at
    most `threshold`; 0.0 otherwise (whole sequences)."""
    kl = torch.nan_to_num(old - logprobs.detach(), nan=0.0)
    return ((advantages >= 0) | (sequences.mean(kl, mask) <= threshold)).to(mask.dtype)


def finalize_metrics(
    sums: torch.Tensor, layout: TokenLayout, config: GRPOLossConfig, has_is_weights: bool
) -> dict[str, torch.Tensor]:
    """Masked means from the summed partials [len(SUM_NAMES)] over the layout's active tokens (the clip ratios at
    sequence level: over its sequences, as TRL averages its [B, 1] flags) under TRL's metric names, as detached
    0-dim tensors."""
    values = dict(zip(SUM_NAMES, sums.unbind(0), strict=True))
    count = layout.mask.sum().clamp(min=1.0)
    flags = count if config.importance_sampling_level == "token" else max(layout.num_seqs, 1)
    metrics = {}
    if config.beta != 0.0:
        metrics["kl"] = values["kl"] / count
    metrics["clip_ratio/low_mean"] = values["clip_low"] / flags
    metrics["clip_ratio/high_mean"] = values["clip_high"] / flags
    metrics["clip_ratio/region_mean"] = values["clip_region"] / flags
    metrics["entropy"] = values["entropy"] / count
    metrics["logprob_mean"] = values["logprob"] / count
    if has_is_weights:
        metrics["is_weight_mean"] = values["is_weight"] / count
    if config.objective_spec.masks_tokens:
        metrics["trust_region/masked_mean"] = values["masked"] / count
    return metrics

"""The table of loss types: the one place that says what each `loss_type` name means.

A loss type is a per-token objective (what each token contributes) and a reduction (how the masked
per-token losses of a batch become one number). Everything that depends on the loss type reads this
table: config validation, the token math (PyTorch and Triton), the fp64 reference, the trainer's
micro-batch scaling and the tests. An unknown name is an error wherever it is named.

Adding a loss type that combines an existing objective and reduction is one `register_loss_type`
call. A new objective is a member of `Objective` with its definition (TRL's formula, differentiated by
autograd in the fp64 reference) in `DEFINITIONS` below, plus its gradient math in `token_math.py`; a Triton
kernel for it is optional (without one, the token math runs in PyTorch on every backend).

Notation: m_i the mask of token i, L_b = Σ_{i∈b} m_i the active tokens of sequence b, B sequences,
N = Σ m the active tokens of the batch; ρ_i the ratio π/π_old (per token, or one per sequence at
importance_sampling_level="sequence"), A_i the advantage, ℓ_i the logprob, o_i the old logprob, sg the
stop-gradient. Every row mirrors TRL 1.16's `GRPOTrainer._compute_loss` for the same name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import torch


class Objective(Enum):
    """The per-token surrogate p_i of ratio ρ_i and advantage A_i (token_math.py has the gradients).

    Importance weights w_i (`is_weights`, TRL's vLLM importance_sampling_ratio) multiply p_i, except
    for VESPO, which folds them into its sequence weight."""

    CLIPPED = "clipped"
    """PPO's clipped surrogate −min(ρA, clip(ρ, 1 − ε_lo, 1 + ε_hi)A), optionally ρ capped at δ."""
    CISPO = "cispo"
    """REINFORCE with the detached, capped ratio: −sg(min(ρ, ε_hi)) A ℓ (MiniMax-M1). Needs epsilon_high."""
    SAPO = "sapo"
    """A soft gate instead of the clip: −(4/τ) σ(τ (ρ − 1)) A with τ = sapo_temperature_pos where A > 0,
    sapo_temperature_neg otherwise (SAPO, arXiv 2511.20347). Its slope at ρ = 1 is that of ρA."""
    VESPO = "vespo"
    """REINFORCE scaled by a detached gamma weight of the sequence's ratio: −sg(φ_b) A ℓ with
    φ = exp(λ + k log W − λ W) (φ(1) = 1), log W = clamp(Σ_{i∈b} m_i (clamp(ℓ_i − o_i, −20, 20)
    + clamp(log w_i, log 1e-8, 20)), log 1e-8, 20) (weights given per sequence: clamp(log w_b) once)
    — the sum of the token log-ratios, whatever importance_sampling_level says — and (k, λ) =
    (vespo_k_pos, vespo_lambda_pos) where A ≥ 0, the _neg pair otherwise, λ floored at 1e-4; an
    overflowing φ counts as 0 (VESPO, arXiv 2602.10693)."""

    @property
    def needs_whole_sequences(self) -> bool:
        """Whether a token's term depends on the other tokens of its sequence at token level too (VESPO's
        φ_b), so that layer 2 must see whole sequences at once."""
        return self is Objective.VESPO


class Reduction(Enum):
    """How the masked per-token losses become the batch loss, as a weight c_i per token (Σ c_i p_i)."""

    SEQUENCE_MEAN = "sequence_mean"
    """c_i = m_i / (B · L_b): each sequence's token mean, then the mean over sequences."""
    TOKEN_MEAN = "token_mean"
    """c_i = m_i / N with N this call's active tokens. In the trainer (as in TRL) the call is one micro-batch:
    bnpo is the mean over micro-batches of each one's own token mean, not the batch's token mean (dapo)."""
    CONSTANT_LENGTH = "constant_length"
    """c_i = m_i / (B · max_completion_length): no length bias (Dr. GRPO)."""
    GLOBAL_TOKEN_MEAN = "global_token_mean"
    """c_i = m_i / num_items_in_batch: the active tokens of the whole accumulated batch."""
    SEQUENCE_SUM = "sequence_sum"
    """c_i = m_i / B: each sequence's token sum, then the mean over sequences (LUSPO: a sequence weighs
    by its length)."""

    def micro_batch_share(self, rows: int, batch_rows: int, tokens: int, batch_tokens: int) -> float:
        """s by which the trainer scales a micro-batch's loss, computed alone, so that the accumulated
        gradient is TRL's (`GRPOTrainer._compute_loss` per micro-batch, summed over an accumulation window).

        Sequence reductions: rows / batch_rows — TRL's 1 / gradient_accumulation_steps for equal-row
        micro-batches, and then the micro-batches add up to the whole batch's loss. Global reductions are
        given the batch's token count (num_items_in_batch): 1. TOKEN_MEAN (bnpo): also rows / batch_rows —
        TRL normalises bnpo by each micro-batch's own active tokens and divides by the accumulation steps,
        so it does not add up to the batch's token mean; with micro-batches packed under a token budget
        (unequal rows) each micro-batch's token mean weighs by its share of the batch's sequences.

        rows, tokens: sequences and active tokens of the micro-batch; batch_*: of the whole batch.
        """
        if self in (
            Reduction.SEQUENCE_MEAN,
            Reduction.CONSTANT_LENGTH,
            Reduction.SEQUENCE_SUM,
            Reduction.TOKEN_MEAN,
        ):
            return rows / max(batch_rows, 1)
        if self is Reduction.GLOBAL_TOKEN_MEAN:
            return 1.0
        raise NotImplementedError(f"no micro-batch share for reduction {self.value!r}")


@dataclass(frozen=True)
class LossType:
    """One row of the table: a name (TRL's where TRL has it), its objective and its reduction."""

    name: str
    objective: Objective
    reduction: Reduction
    summary: str = ""


LOSS_TYPES: dict[str, LossType] = {}


def register_loss_type(loss_type: LossType) -> LossType:
    """Add a row to the table (a name may be registered once)."""
    if loss_type.name in LOSS_TYPES:
        raise ValueError(f"loss_type: {loss_type.name!r} is already registered")
    if not isinstance(loss_type.objective, Objective) or not isinstance(loss_type.reduction, Reduction):
        raise TypeError("LossType: objective and reduction must be members of Objective and Reduction")
    LOSS_TYPES[loss_type.name] = loss_type
    return loss_type


def get_loss_type(name: str) -> LossType:
    """The row named `name`; ValueError naming the known types otherwise."""
    try:
        return LOSS_TYPES[name]
    except (KeyError, TypeError):
        raise ValueError(f"loss_type: expected one of {tuple(LOSS_TYPES)}, got {name!r}") from None


@dataclass(frozen=True)
class SurrogateInputs:
    """An objective's inputs in TRL's padded layout, all [B, T] (ratio and weights may be [B, 1]).

    ratio: ρ = exp(log_ratio) at the configured importance-sampling level (differentiable); log_ratio: the token
    log-ratios ℓ − o; advantages A; logprobs ℓ; mask m; is_weights w or None; config: the GRPOLossConfig."""

    ratio: torch.Tensor
    log_ratio: torch.Tensor
    advantages: torch.Tensor
    logprobs: torch.Tensor
    mask: torch.Tensor
    is_weights: torch.Tensor | None
    config: object


Definition = Callable[[SurrogateInputs], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""inputs -> (per-token surrogate p [B, T] before weights and reduction, low-clip flags, high-clip flags [B, T])."""


def _clipped(x: SurrogateInputs):
    c = x.config
    clipped = torch.clamp(x.ratio, 1 - c.epsilon_low, 1 + c.clip_high)
    unclipped = x.ratio if c.delta is None else torch.clamp(x.ratio, max=c.delta)
    low = (x.ratio < 1 - c.epsilon_low) & (x.advantages < 0)
    high = (x.ratio > 1 + c.clip_high) & (x.advantages > 0)
    return -torch.min(unclipped * x.advantages, clipped * x.advantages), low, high


def _cispo(x: SurrogateInputs):
    capped = torch.clamp(x.ratio, max=x.config.clip_high).detach()
    high = (x.ratio > x.config.clip_high) & (x.advantages > 0)
    return -capped * x.advantages * x.logprobs, torch.zeros_like(high), high


def _sapo(x: SurrogateInputs):
    c, adv = x.config, x.advantages
    tau = torch.where(adv > 0, adv.new_tensor(c.sapo_temperature_pos), adv.new_tensor(c.sapo_temperature_neg))
    none = torch.zeros_like(adv, dtype=torch.bool)  # no clipping: TRL logs no clip ratios
    return -torch.sigmoid(tau * (x.ratio - 1)) * 4 / tau * adv, none, none


def _vespo(x: SurrogateInputs):
    none = torch.zeros_like(x.advantages, dtype=torch.bool)
    return -_gamma_weights(x) * x.advantages * x.logprobs, none, none


@torch.no_grad()
def _gamma_weights(x: SurrogateInputs) -> torch.Tensor:
    """VESPO's φ, TRL's `GRPOTrainer.get_gamma_weights` (is_weights: its per-token importance_sampling_ratio
    [B, T], here 0 at padding, so the log-weights are masked; or one ratio per sequence [B, 1], added once)."""
    c, adv, mask = x.config, x.advantages, x.mask
    lower_clamp = math.log(1e-8)
    seq_log_ratio = torch.sum(torch.clamp(x.log_ratio, -20.0, 20.0) * mask, dim=-1, keepdim=True)
    if x.is_weights is not None:
        log_is_ratio = torch.clamp(torch.log(x.is_weights), lower_clamp, 20.0)
        if x.is_weights.shape[-1] != 1 or mask.shape[-1] == 1:  # per token: masked (TRL's are 1 at padding)
            log_is_ratio = log_is_ratio * mask
        seq_log_ratio = seq_log_ratio + torch.sum(log_is_ratio, dim=-1, keepdim=True)  # per sequence: once
    log_w_seq = torch.clamp(seq_log_ratio, lower_clamp, 20.0)
    nonneg = adv >= 0
    k = torch.where(nonneg, adv.new_tensor(c.vespo_k_pos), adv.new_tensor(c.vespo_k_neg))
    lam = torch.where(nonneg, adv.new_tensor(c.vespo_lambda_pos), adv.new_tensor(c.vespo_lambda_neg)).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w_seq - lam * torch.exp(log_w_seq))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


DEFINITIONS: dict[Objective, Definition] = {
    Objective.CLIPPED: _clipped,
    Objective.CISPO: _cispo,
    Objective.SAPO: _sapo,
    Objective.VESPO: _vespo,
}
"""Each objective's definition as TRL 1.16 computes it, for the fp64 reference (autograd gives its gradient)."""
WEIGHTS_INSIDE = frozenset({Objective.VESPO})
"""Objectives whose importance weights enter the surrogate itself instead of multiplying it."""


for _row in (
    LossType("grpo", Objective.CLIPPED, Reduction.SEQUENCE_MEAN, "GRPO: per-sequence token mean"),
    LossType("bnpo", Objective.CLIPPED, Reduction.TOKEN_MEAN, "token mean of the (micro-)batch"),
    LossType("dr_grpo", Objective.CLIPPED, Reduction.CONSTANT_LENGTH, "Dr. GRPO: sum / (B * max length)"),
    LossType("dapo", Objective.CLIPPED, Reduction.GLOBAL_TOKEN_MEAN, "DAPO: token mean of the whole batch"),
    LossType("cispo", Objective.CISPO, Reduction.GLOBAL_TOKEN_MEAN, "CISPO: capped-ratio REINFORCE"),
    LossType("sapo", Objective.SAPO, Reduction.SEQUENCE_MEAN, "SAPO: sigmoid-gated ratio, reduced like grpo"),
    LossType("luspo", Objective.CLIPPED, Reduction.SEQUENCE_SUM, "LUSPO: clipped, per-sequence token sums"),
    LossType("vespo", Objective.VESPO, Reduction.GLOBAL_TOKEN_MEAN, "VESPO: gamma-weighted REINFORCE, like dapo"),
):
    register_loss_type(_row)

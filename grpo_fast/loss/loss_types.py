"""The table of loss types: the one place that says what each `loss_type` name means.

A loss type is a per-token objective (what each token contributes) and a reduction (how the masked
per-token losses of a batch become one number). Everything that depends on the loss type reads this
table: config validation, the token math (PyTorch and Triton), the fp64 reference, the trainer's
micro-batch scaling and the tests. An unknown name is an error wherever it is named.

Adding a loss type that combines an existing objective and reduction is one `register_loss_type`
call; a new objective or reduction also needs its math in `token_math.py` (and the Triton twin).

Notation: m_i the mask of token i, L_b = Σ_{i∈b} m_i the active tokens of sequence b, B sequences,
N = Σ m the active tokens of the batch; ρ_i the ratio π/π_old (per token, or one per sequence at
importance_sampling_level="sequence"), A_i the advantage, ℓ_i the logprob, o_i the old logprob, sg the
stop-gradient. Every row mirrors TRL 1.16's `GRPOTrainer._compute_loss` for the same name.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


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

"""The table of loss types: the one place that says what each `loss_type` name means.

A loss type is a per-token objective (what each token contributes) and a reduction (how the masked
per-token losses of a batch become one number). Everything that depends on the loss type reads this
table: config validation, the token math (PyTorch and Triton), the fp64 reference, the trainer's
micro-batch scaling and the tests. An unknown name is an error wherever it is named.

Adding a loss type that combines an existing objective and reduction is one `register_loss_type`
call; a new objective or reduction also needs its math in `token_math.py` (and the Triton twin).

Notation: m_i the mask of token i, L_b = Σ_{i∈b} m_i the active tokens of sequence b, B sequences,
N = Σ m the active tokens of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Objective(Enum):
    """The per-token surrogate p_i of ratio ρ_i and advantage A_i (token_math.py has the gradients)."""

    CLIPPED = "clipped"
    """PPO's clipped surrogate −min(ρA, clip(ρ, 1 − ε_lo, 1 + ε_hi)A), optionally ρ capped at δ."""
    CISPO = "cispo"
    """REINFORCE with the detached, capped ratio: −sg(min(ρ, ε_hi)) A ℓ (MiniMax-M1). Needs epsilon_high."""


class Reduction(Enum):
    """How the masked per-token losses become the batch loss, as a weight c_i per token (Σ c_i p_i)."""

    SEQUENCE_MEAN = "sequence_mean"
    """c_i = m_i / (B · L_b): each sequence's token mean, then the mean over sequences."""
    TOKEN_MEAN = "token_mean"
    """c_i = m_i / N with N this call's active tokens."""
    CONSTANT_LENGTH = "constant_length"
    """c_i = m_i / (B · max_completion_length): no length bias (Dr. GRPO)."""
    GLOBAL_TOKEN_MEAN = "global_token_mean"
    """c_i = m_i / num_items_in_batch: the active tokens of the whole accumulated batch."""

    def micro_batch_share(self, rows: int, batch_rows: int, tokens: int, batch_tokens: int) -> float:
        """s such that the losses of a batch's micro-batches, each computed alone and scaled by s, add up
        to the whole batch's loss (global reductions are given the batch's counts and need no scaling).

        rows, tokens: sequences and active tokens of the micro-batch; batch_*: of the whole batch.
        """
        if self in (Reduction.SEQUENCE_MEAN, Reduction.CONSTANT_LENGTH):
            return rows / batch_rows
        if self is Reduction.TOKEN_MEAN:
            return tokens / max(batch_tokens, 1)
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
):
    register_loss_type(_row)

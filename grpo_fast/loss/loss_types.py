"""The loss types: the one place that says what each `loss_type` name means.

A loss type is a per-token objective (what each token contributes; grpo_fast.loss.objective) and a reduction (how
the masked per-token losses of a batch become one number), with the name TRL gives it, if any. Everything that
depends on the loss type reads this registry: config validation, the token math (PyTorch and Triton), the fp64
reference, the trainer's micro-batch scaling, the docs (scripts/config_docs.py) and the tests — TRL's parity tests
run exactly the rows with a `trl_name`. An unknown name is an error wherever it is named.

A loss type that combines an existing objective and reduction is one `LOSS_TYPES.register` call (or a row named in
YAML as "package.module:attribute"). A new objective is one module (grpo_fast.loss.objectives has one per method).

Notation: m_i the mask of token i, L_b = Σ_{i∈b} m_i the active tokens of sequence b, B sequences,
N = Σ m the active tokens of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..registry import Registry
from .objective import OBJECTIVES, Objective
from .objectives.trl import CISPO, CLIPPED, SAPO, VESPO


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
    """One loss type: its name, its objective (an Objective, or the name or "package.module:attribute" of a
    registered one, resolved when the row is made), its reduction, a summary, and TRL's `loss_type` for the same
    formulas (None: TRL has no such row)."""

    name: str
    objective: Objective | str
    reduction: Reduction
    summary: str = ""
    trl_name: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.objective, str):
            object.__setattr__(
                self, "objective", OBJECTIVES.get(self.objective, key=f"loss type {self.name!r}, objective")
            )


def check_loss_type(name: str, loss_type: Any) -> LossType:
    """`loss_type` if it is a LossType named `name` with a registered-kind objective and a Reduction; TypeError
    naming what is wrong otherwise."""
    if not isinstance(loss_type, LossType):
        raise TypeError(f"loss type {name!r}: expected a LossType, got {type(loss_type).__name__}")
    if ":" not in name and loss_type.name != name:  # "package.module:attribute" names no `name`
        raise TypeError(f"loss type {name!r}: its `name` is {loss_type.name!r}")
    if not isinstance(loss_type.reduction, Reduction):
        raise TypeError(f"loss type {name!r}: reduction must be a member of Reduction, got {loss_type.reduction!r}")
    OBJECTIVES.contract(f"{loss_type.objective!r} of loss type {name!r}", loss_type.objective)
    return loss_type


TRL_ROWS = (
    LossType("grpo", CLIPPED, Reduction.SEQUENCE_MEAN, "GRPO: per-sequence token mean", "grpo"),
    LossType("bnpo", CLIPPED, Reduction.TOKEN_MEAN, "token mean of the (micro-)batch", "bnpo"),
    LossType("dr_grpo", CLIPPED, Reduction.CONSTANT_LENGTH, "Dr. GRPO: sum / (B * max length)", "dr_grpo"),
    LossType("dapo", CLIPPED, Reduction.GLOBAL_TOKEN_MEAN, "DAPO: token mean of the whole batch", "dapo"),
    LossType("cispo", CISPO, Reduction.GLOBAL_TOKEN_MEAN, "CISPO: capped-ratio REINFORCE, reduced like dapo", "cispo"),
    LossType("sapo", SAPO, Reduction.SEQUENCE_MEAN, "SAPO: sigmoid-gated ratio, reduced like grpo", "sapo"),
    LossType("luspo", CLIPPED, Reduction.SEQUENCE_SUM, "LUSPO: clipped, per-sequence token sums", "luspo"),
    LossType("vespo", VESPO, Reduction.GLOBAL_TOKEN_MEAN, "VESPO: gamma-weighted REINFORCE, like dapo", "vespo"),
)
"""Every row TRL 1.16's `GRPOTrainer._compute_loss` knows, under its name and with its formulas."""

LOSS_TYPES = Registry(
    "loss type",
    {
        **{row.name: row for row in TRL_ROWS},
        "icepop": "grpo_fast.loss.objectives.icepop:LOSS_TYPE",
        "kpop": "grpo_fast.loss.objectives.kpop:LOSS_TYPE",
        "ipo": "grpo_fast.loss.objectives.ipo:LOSS_TYPE",
        "dppo_tv": "grpo_fast.loss.objectives.dppo:DPPO_TV_LOSS_TYPE",
        "dppo_kl": "grpo_fast.loss.objectives.dppo:DPPO_KL_LOSS_TYPE",
        "gmpo": "grpo_fast.loss.objectives.gmpo:LOSS_TYPE",
    },
    contract=check_loss_type,
)
"""The loss types by name (`loss_type`); a plug-in row registers here or is named as "package.module:attribute"."""


def register_loss_type(loss_type: LossType) -> LossType:
    """Add a row under its own name (checked now; a name is registered once)."""
    return LOSS_TYPES.register(loss_type.name, loss_type)


def get_loss_type(name: str, key: str = "loss_type") -> LossType:
    """The row named `name` (or "package.module:attribute"); ValueError naming `key` and the known types otherwise."""
    return LOSS_TYPES.get(name, key=key)

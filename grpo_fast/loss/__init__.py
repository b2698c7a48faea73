"""The GRPO loss: front ends, options, the loss-type table and the token math (layer 2).

    grpo_loss / GRPOLoss    loss from hidden states and the lm_head weight (fused_loss.py)
    fused_logprobs          per-token logprobs and entropies alone (logprobs.py)
    logits_grpo_loss        loss from logits the caller already holds (logits_loss.py)
    GRPOLossConfig          the options (options.py)
    LOSS_TYPES              the loss types: an objective and a reduction each (loss_types.py)
    OBJECTIVES, Objective   the per-token objectives, each one definition (objective.py, objectives/)

Layer 1 (the vocabulary-sized GEMMs and their epilogue) lives in grpo_fast.backends.
"""

from .fused_loss import GRPOLoss, grpo_loss
from .logits_loss import logits_grpo_loss
from .logprobs import fused_logprobs
from .loss_types import LOSS_TYPES, LossType, Reduction, get_loss_type, register_loss_type
from .objective import OBJECTIVES, Objective, ObjectiveOptions, Surrogate, SurrogateInputs
from .options import GRPOLossConfig

__all__ = [
    "LOSS_TYPES",
    "OBJECTIVES",
    "GRPOLoss",
    "GRPOLossConfig",
    "LossType",
    "Objective",
    "ObjectiveOptions",
    "Reduction",
    "Surrogate",
    "SurrogateInputs",
    "fused_logprobs",
    "get_loss_type",
    "grpo_loss",
    "logits_grpo_loss",
    "register_loss_type",
]

"""grpo_fast: kernel-accelerated GRPO / RLVR post-training.

from grpo_fast import fused_logprobs, grpo_loss, GRPOLossConfig, GRPOLoss, logits_grpo_loss
"""

from .config import GRPOLossConfig
from .logits_loss import logits_grpo_loss
from .logprobs import fused_logprobs
from .loss import GRPOLoss, grpo_loss

__all__ = ["GRPOLoss", "GRPOLossConfig", "fused_logprobs", "grpo_loss", "logits_grpo_loss"]
__version__ = "0.1.0"

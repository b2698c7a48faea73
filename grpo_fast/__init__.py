"""grpo_fast: kernel-accelerated GRPO / RLVR post-training.

    from grpo_fast import fused_logprobs, grpo_loss, GRPOLossConfig, GRPOLoss, logits_grpo_loss

The names load on first use, so `import grpo_fast.rewards` (e.g. in reward worker processes)
does not pay for importing torch.
"""

from grpo_fast.registry import lazy_exports

_EXPORTS = {name: "loss" for name in ("GRPOLossConfig", "GRPOLoss", "fused_logprobs", "grpo_loss", "logits_grpo_loss")}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

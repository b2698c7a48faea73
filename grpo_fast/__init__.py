"""grpo_fast: kernel-accelerated GRPO / RLVR post-training.

    from grpo_fast import fused_logprobs, grpo_loss, GRPOLossConfig, GRPOLoss, logits_grpo_loss

The names load on first use, so `import grpo_fast.rewards` (e.g. in reward worker processes)
does not pay for importing torch.
"""

import importlib

_EXPORTS = ("GRPOLossConfig", "GRPOLoss", "fused_logprobs", "grpo_loss", "logits_grpo_loss")
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(".loss", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'grpo_fast' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))

"""The GRPO training loop: config tree, advantages, policy forward, checkpoints, offload, metrics."""

from grpo_fast.trainer.config import TrainConfig, load_config
from grpo_fast.trainer.trainer import GRPOTrainer

__all__ = ["GRPOTrainer", "TrainConfig", "load_config"]

"""TRL 1.16's `GRPOTrainer._compute_loss` as a reference the tests call directly: a trainer made without
`__init__` (no model, no data), holding the attributes `_compute_loss` reads, set from a `GRPOLossConfig` as
`GRPOTrainer.__init__` sets them from a `GRPOConfig`, and a one-process stand-in for its accelerator."""

from __future__ import annotations

import math
import types
from collections import defaultdict

from ..loss.options import GRPOLossConfig

# GRPOLossConfig fields that TRL reads from `trainer.args` under the same names.
ARGS_OPTIONS = ("use_bias_correction_kl", "delta", "sapo_temperature_pos", "sapo_temperature_neg")
ARGS_OPTIONS += ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")


class OneProcessAccelerator:
    """What `_compute_loss` uses of accelerate's Accelerator, for a single process."""

    num_processes = 1
    sync_gradients = True

    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather

    @staticmethod
    def reduce(x, reduction="sum"):
        return x

    @staticmethod
    def pad_across_processes(x, dim=0, pad_index=0):
        return x


def bare_trl_trainer(
    config: GRPOLossConfig, max_completion_length: int, use_is: bool, training: bool = False, **extra_args
):
    """A `trl.GRPOTrainer` for `_compute_loss` alone. use_is: vLLM importance-sampling correction on (the
    inputs then carry `importance_sampling_ratio`); training: train mode (accumulation scaling, set
    `current_gradient_accumulation_steps`); extra_args: further `trainer.args` attributes."""
    from trl import GRPOTrainer  # noqa: PLC0415 - trl is a test dependency only

    trainer = object.__new__(GRPOTrainer)
    trainer.args = types.SimpleNamespace(**{n: getattr(config, n) for n in ARGS_OPTIONS}, steps_per_generation=1)
    vars(trainer.args).update(extra_args)
    if config.loss_spec.trl_name is None or config.objective is not None:
        raise ValueError(f"loss_type: {config.loss_type!r} (objective {config.objective_spec.name!r}) has no TRL row")
    trainer.loss_type = config.loss_spec.trl_name
    trainer.beta = config.beta
    trainer.epsilon_low, trainer.epsilon_high = config.epsilon_low, config.clip_high
    trainer.importance_sampling_level = config.importance_sampling_level
    trainer.max_completion_length = max_completion_length
    trainer.top_entropy_quantile = config.top_entropy_quantile
    trainer.off_policy_mask_threshold = config.off_policy_mask_threshold
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = use_is
    trainer.entropy_coef = config.entropy_coef
    trainer.use_adaptive_entropy = False
    trainer._entropy_bonus_enabled = config.entropy_coef != 0.0
    trainer._last_world_entropy = math.inf
    trainer._entropy_window_stats = None
    trainer.aux_loss_enabled = False
    trainer.model = types.SimpleNamespace(training=training)
    trainer.current_gradient_accumulation_steps = 1
    trainer.accelerator = OneProcessAccelerator()
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    return trainer

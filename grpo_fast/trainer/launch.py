"""A run from its config: the trainer for the model, datasets and rewards a TrainConfig names, and the launch
checklist before training (what `grpo-fast train` and the pipeline's train stage do)."""

from __future__ import annotations

from grpo_fast.data.loading import load_prompt_dataset
from grpo_fast.trainer.config import TrainConfig
from grpo_fast.trainer.preflight import PreflightReport
from grpo_fast.trainer.trainer import GRPOTrainer


def trainer_from_config(cfg: TrainConfig) -> GRPOTrainer:
    """A GRPOTrainer for the model, datasets and rewards `cfg` names (ValueError naming what cannot be used)."""
    if not cfg.model.path:
        raise ValueError("model.path: required (the policy to train)")
    data = cfg.data
    train = load_prompt_dataset(data.source, prompt_column=data.prompt_column, **data.task_kwargs)
    evals = None
    if data.eval_source:
        evals = load_prompt_dataset(
            data.eval_source, prompt_column=data.prompt_column, key="data.eval_source", **data.eval_task_kwargs
        )
    return GRPOTrainer(cfg.model.path, cfg.reward.funcs, train, config=cfg, eval_dataset=evals)


def launch_checks(cfg: TrainConfig, trainer: GRPOTrainer) -> PreflightReport:
    """The launch checklist (grpo_fast.trainer.preflight), with the SFT-control baseline when check.sft_control_source
    names one; raises PreflightError when the run would learn a broken reward."""
    control = None
    if cfg.check.sft_control_source:
        control = load_prompt_dataset(cfg.check.sft_control_source, key="check.sft_control_source").to_list()
    return trainer.preflight(control)

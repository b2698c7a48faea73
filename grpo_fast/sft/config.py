"""The SFT configuration: a tree of sections in the style of `TrainConfig` (grpo_fast.trainer.config), fields
with their own help and bounds (grpo_fast.config_fields), loaded from YAML (or a dict) and `--set key=value`
overrides.

Sections: model and optim (the GRPO config's own `ModelConfig` / `OptimConfig`), data, run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grpo_fast.config_fields import Auto, ConfigSection, option
from grpo_fast.core.config_tree import load_tree
from grpo_fast.core.optim import OptimConfig
from grpo_fast.core.policy import ModelConfig
from grpo_fast.core.trackers import ReportingOptions, check_installed, upgrade_tensorboard


@dataclass
class SFTDataConfig(ConfigSection):
    """The examples, in one of TRL's SFT conventions (grpo_fast.sft.data), and how they are encoded."""

    key = "data"
    source: str = option("", "a local .jsonl / .parquet / .csv file or a hub dataset name")
    split: str = option("train", "the hub dataset's split")
    format: Literal["auto", "prompt_completion", "messages", "text"] = option(
        "auto", "auto: prompt_column + completion_column, else `messages`, else `text`; other columns are ignored"
    )
    prompt_column: str = option("prompt", "the prompt column (prompt_completion)")
    completion_column: str = option("completion", "the completion column (prompt_completion)")
    use_chat_template: bool | Auto = option(
        "auto", "encode prompts through the chat template, exactly as the GRPO run does (auto: when it has one)"
    )
    system_prompt: str | None = option(None, "a system message put before every chat prompt")
    max_length: int | None = option(
        1024, "tokens per example; longer ones lose their end (null: no truncation; packing needs a length)", low=1
    )
    packing: bool = option(
        True, "examples concatenated into rows of at most max_length tokens (padded where the model cannot pack)"
    )
    add_eos: bool = option(True, "EOS after every string completion and text")


@dataclass
class SFTRunConfig(ConfigSection, ReportingOptions):
    """Steps, micro-batches, output: one optimizer step accumulates grad_accum micro-batches."""

    key = "run"
    MOVED = {"tensorboard": "run.report_to"}
    output_dir: str = option("runs/sft", "checkpoints, metrics, plots, the final model and summary.json")
    epochs: int = option(1, "passes over the data when max_steps is null", low=1)
    max_steps: int | None = option(None, "optimizer steps (null: epochs)", low=1)
    micro_batch_tokens: int | None = option(
        8192, "tokens per micro-batch counted with padding, rows x widest row (null: no bound)", low=1
    )
    micro_batch_size: int | None = option(None, "rows per micro-batch (null: no bound)", low=1)
    grad_accum: int = option(1, "micro-batches per optimizer step", low=1)
    seed: int = option(0, "seed of the data order", low=0, high=2**32 - 1)
    log_every: int = option(1, "steps between progress lines", low=1)
    save_every: int = option(0, "steps between checkpoints (0: only the final model)", low=0)
    keep_checkpoints: int | None = option(None, "keep the newest K checkpoints (null: all)", low=1)
    resume: bool = option(False, "continue from the latest checkpoint under output_dir")
    overwrite: bool = option(False, "a fresh run in an output_dir of an earlier run deletes that run's files")
    bf16: bool | Auto = option("auto", "bf16 autocast (auto: on GPU, off on CPU)")


@dataclass
class SFTConfig(ConfigSection):
    """The whole SFT run."""

    model: ModelConfig = option(help="the model", factory=ModelConfig)
    data: SFTDataConfig = option(help="the examples", factory=SFTDataConfig)
    optim: OptimConfig = option(help="the optimizer", factory=lambda: OptimConfig(lr=2e-5))
    run: SFTRunConfig = option(help="the run", factory=SFTRunConfig)

    def __post_init__(self) -> None:
        validate(self)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def validate(cfg: SFTConfig) -> None:
    """The rules between fields; ValueError naming the key."""
    run, data = cfg.run, cfg.data
    check_installed(run.report_to)
    if run.micro_batch_tokens is None and run.micro_batch_size is None:
        raise ValueError("run.micro_batch_tokens: set it or run.micro_batch_size (both are null)")
    if data.packing and data.max_length is None:
        raise ValueError("data.max_length: packing needs a row length (set it, or data.packing: false)")
    if run.micro_batch_tokens is not None and data.max_length is not None and run.micro_batch_tokens < data.max_length:
        raise ValueError(
            f"run.micro_batch_tokens: {run.micro_batch_tokens} cannot hold one example of data.max_length "
            f"{data.max_length} tokens"
        )


def load_sft_config(source: str | Path | dict | None = None, overrides: list[str] | None = None) -> SFTConfig:
    """SFTConfig from a YAML file or a nested dict, then `key.sub=value` overrides (values parsed as YAML)."""
    return load_tree(SFTConfig, source, overrides, upgrades=(upgrade_tensorboard,))

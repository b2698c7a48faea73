"""The SFT configuration: a dataclass tree in the style of `TrainConfig` (grpo_fast.trainer.config), loaded
from YAML (or a dict) and `--set key=value` overrides, validated with errors that name the key.

Sections: model and optim (the GRPO config's own `ModelConfig` / `OptimConfig`), data, run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from grpo_fast.trainer.config import ModelConfig, OptimConfig, check_fields, load_tree


@dataclass
class SFTDataConfig:
    """source: a local .jsonl/.parquet/.csv or a hub name (its `split`), in one of TRL's SFT conventions
    (grpo_fast.sft.data), chosen by `format` ("auto": prompt_column + completion_column, else `messages`,
    else `text`; other columns are ignored). use_chat_template / system_prompt: how prompts are encoded,
    exactly as the GRPO run encodes them (grpo_fast.trainer.rollout_phase.PromptEncoder). max_length: tokens
    per example, longer ones lose their end (None: no truncation; packing needs a length). packing: examples
    concatenated into rows of at most max_length tokens (falls back to padded batches where the model's
    attention cannot keep packed examples apart). add_eos: EOS after every string completion and text."""

    source: str = ""
    split: str = "train"
    format: str = "auto"
    prompt_column: str = "prompt"
    completion_column: str = "completion"
    use_chat_template: str = "auto"
    system_prompt: str | None = None
    max_length: int | None = 1024
    packing: bool = True
    add_eos: bool = True


@dataclass
class SFTRunConfig:
    """One optimizer step accumulates `grad_accum` micro-batches; a micro-batch holds at most
    `micro_batch_tokens` tokens counted with padding (rows x widest row) and at most `micro_batch_size` rows
    (None: no bound; at least one of the two must be set). Training lasts `max_steps` optimizer steps, or
    `epochs` passes over the data when max_steps is None. save_every: steps between checkpoints (0: only
    the final model); keep_checkpoints: how many to keep (None: all). bf16: "auto" = autocast on GPU."""

    output_dir: str = "runs/sft"
    epochs: int = 1
    max_steps: int | None = None
    micro_batch_tokens: int | None = 8192
    micro_batch_size: int | None = None
    grad_accum: int = 1
    seed: int = 0
    log_every: int = 1
    save_every: int = 0
    keep_checkpoints: int | None = None
    resume: bool = False
    bf16: str = "auto"
    tensorboard: bool = True
    progress: bool = True
    plots: bool = True


@dataclass
class SFTConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-5))
    run: SFTRunConfig = field(default_factory=SFTRunConfig)

    def __post_init__(self) -> None:
        validate(self)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_CHOICES = {
    "model.dtype": ("float32", "bfloat16", "float16"),
    "data.format": ("auto", "prompt_completion", "messages", "text"),
    "data.use_chat_template": ("auto", "true", "false"),
    "optim.lr_scheduler": ("constant", "linear", "cosine"),
    "run.bf16": ("auto", "true", "false"),
}
_POSITIVE = (
    "data.max_length",
    "optim.lr",
    "run.epochs",
    "run.max_steps",
    "run.micro_batch_tokens",
    "run.micro_batch_size",
    "run.grad_accum",
    "run.log_every",
    "run.keep_checkpoints",
)


def validate(cfg: SFTConfig) -> None:
    """Raises ValueError naming the key for a bad value (types are checked by `from_dict`)."""
    check_fields(cfg, _CHOICES, _POSITIVE)
    run, data = cfg.run, cfg.data
    if run.micro_batch_tokens is None and run.micro_batch_size is None:
        raise ValueError("run.micro_batch_tokens: set it or run.micro_batch_size (both are null)")
    if data.packing and data.max_length is None:
        raise ValueError("data.max_length: packing needs a row length (set it, or data.packing: false)")
    if run.micro_batch_tokens is not None and data.max_length is not None and run.micro_batch_tokens < data.max_length:
        raise ValueError(
            f"run.micro_batch_tokens: {run.micro_batch_tokens} cannot hold one example of data.max_length "
            f"{data.max_length} tokens"
        )
    if run.save_every < 0:
        raise ValueError(f"run.save_every: expected >= 0 (0: final model only), got {run.save_every}")
    if cfg.optim.warmup_steps < 0:
        raise ValueError(f"optim.warmup_steps: expected >= 0, got {cfg.optim.warmup_steps}")


def load_sft_config(source: str | Path | dict | None = None, overrides: list[str] | None = None) -> SFTConfig:
    """SFTConfig from a YAML file or a nested dict, then `key.sub=value` overrides (values parsed as YAML)."""
    return load_tree(SFTConfig, source, overrides)

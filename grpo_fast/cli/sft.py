"""`grpo-fast sft --config sft.yaml [--set key=value ...] [--resume | --overwrite] [--print-config]`: supervised
fine-tuning on the fused path (grpo_fast.sft); the model for the next stage lands in run.output_dir/final."""

from __future__ import annotations

import argparse
import json

from grpo_fast.cli.train import add_config_arguments, load_cli_config, refuse_torchrun
from grpo_fast.core.checkpoint import UnsafeCheckpointError
from grpo_fast.sft.config import SFTConfig, load_sft_config
from grpo_fast.sft.trainer import run_sft


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, SFTConfig)
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in run.output_dir")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in a run.output_dir that holds an earlier run, deleting its checkpoints, metrics and model",
    )


def main(args: argparse.Namespace) -> int:
    refuse_torchrun("sft")
    flags = {"resume": "run.resume=true", "overwrite": "run.overwrite=true"}
    cfg = load_cli_config(args, [v for k, v in flags.items() if getattr(args, k)], loader=load_sft_config)
    if cfg is None:
        return 0
    for key, value in (("model.path", cfg.model.path), ("data.source", cfg.data.source)):
        if not value:
            raise SystemExit(f"grpo-fast sft: {key} is required")
    try:
        summary = run_sft(cfg)
    except (ValueError, UnsafeCheckpointError) as exc:  # a model, dataset, output directory or checkpoint refused
        raise SystemExit(f"grpo-fast sft: {exc}") from None
    print(json.dumps({k: summary[k] for k in ("steps", "first_loss", "final_loss", "packing", "final_model")}))
    return 0

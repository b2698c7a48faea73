"""`grpo-fast sft --config sft.yaml [--set key=value ...] [--resume] [--print-config]`: supervised
fine-tuning on the fused path (grpo_fast.sft); the model for the next stage lands in run.output_dir/final."""

from __future__ import annotations

import argparse
import json

from grpo_fast.cli.train import add_config_arguments, load_cli_config
from grpo_fast.sft.config import SFTConfig, load_sft_config
from grpo_fast.sft.trainer import run_sft


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, SFTConfig)
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in run.output_dir")


def main(args: argparse.Namespace) -> int:
    cfg = load_cli_config(args, ["run.resume=true"] if args.resume else [], loader=load_sft_config)
    if cfg is None:
        return 0
    for key, value in (("model.path", cfg.model.path), ("data.source", cfg.data.source)):
        if not value:
            raise SystemExit(f"grpo-fast sft: {key} is required")
    summary = run_sft(cfg)
    print(json.dumps({k: summary[k] for k in ("steps", "first_loss", "final_loss", "packing", "final_model")}))
    return 0

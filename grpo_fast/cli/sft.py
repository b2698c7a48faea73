"""`grpo-fast sft --config sft.yaml [--set key=value ...] [--resume] [--print-config]`: supervised
fine-tuning on the fused path (grpo_fast.sft); the model for the next stage lands in run.output_dir/final."""

from __future__ import annotations

import argparse
import json

from grpo_fast.cli.train import add_config_arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("sft", help="supervised fine-tuning from a YAML config (see configs/sft_demo.yaml)")
    add_config_arguments(p, "YAML file with the SFTConfig tree (model, data, optim, run; grpo_fast.sft.config)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in run.output_dir")
    p.set_defaults(func=_sft)


def _sft(args: argparse.Namespace) -> int:
    from grpo_fast.sft.config import load_sft_config

    overrides = list(args.overrides) + (["run.resume=true"] if args.resume else [])
    try:
        cfg = load_sft_config(args.config, overrides)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"grpo-fast sft: invalid config: {exc}") from None
    if args.print_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    for key, value in (("model.path", cfg.model.path), ("data.source", cfg.data.source)):
        if not value:
            raise SystemExit(f"grpo-fast sft: {key} is required")
    from grpo_fast.sft.trainer import run_sft

    summary = run_sft(cfg)
    print(json.dumps({k: summary[k] for k in ("steps", "first_loss", "final_loss", "packing", "final_model")}))
    return 0

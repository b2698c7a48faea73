"""`grpo-fast demo --output-dir DIR`: the tiny local model, cold-start SFT then GRPO (grpo_fast.demo)."""

from __future__ import annotations

import argparse
import dataclasses

from grpo_fast.demo import driver
from grpo_fast.demo.driver import DemoConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = DemoConfig()
    parser.add_argument("--output-dir", default=defaults.output_dir)
    parser.add_argument("--task", choices=("modular", "code", "tools"), default=defaults.task)
    parser.add_argument(
        "--forge-fraction",
        type=float,
        default=defaults.forge_fraction,
        help="code task: share of completions replaced by answer-forging programs",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--engine", choices=("auto", "vllm", "hf"), default=defaults.engine)
    parser.add_argument("--rl-steps", type=int, default=None, help="GRPO steps (default: the task's)")
    parser.add_argument("--sft-steps", type=int, default=None, help="cold-start SFT steps (default: the task's)")
    parser.add_argument("--no-progress", action="store_true")


def main(args: argparse.Namespace) -> int:
    chosen = {f.name: getattr(args, f.name) for f in dataclasses.fields(DemoConfig) if hasattr(args, f.name)}
    driver.main(DemoConfig(**chosen, progress=not args.no_progress))
    return 0

"""`grpo-fast pipeline --config r1.yaml`: the R1 recipe's stages chained (grpo_fast.pipeline); started
again, it skips the finished stages and resumes the interrupted one."""

from __future__ import annotations

import argparse
import os

from grpo_fast.cli.train import refuse_torchrun
from grpo_fast.pipeline import load_pipeline_config, run_pipeline
from grpo_fast.pipeline.runner import summary_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="pipeline YAML: output_dir and a list of stages")
    parser.add_argument("--output-dir", help="override the config's output_dir")


def main(args: argparse.Namespace) -> int:
    refuse_torchrun("pipeline")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        config = load_pipeline_config(args.config)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"grpo-fast pipeline: invalid config: {exc}") from None
    if args.output_dir:
        config.output_dir = args.output_dir
    try:
        table = run_pipeline(config)
    except ValueError as exc:
        raise SystemExit(f"grpo-fast pipeline: {exc}") from None
    print(summary_table(table))
    return 0

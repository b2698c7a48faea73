"""`grpo-fast sample --config run.yaml [--set sample.samples_per_prompt=16 ...]`: per-prompt pass rates and
a rejection-sampled SFT set from the model at model.path (grpo_fast.curate.sampling). The config is a
training config: its model, data, reward and rollout sections say what to sample and how to score it,
its `sample` section how many and what to keep. Killed and started again, it continues."""

from __future__ import annotations

import argparse
import json

from grpo_fast.cli.train import add_config_arguments, load_cli_config, refuse_torchrun
from grpo_fast.curate.sampling import run_sampling
from grpo_fast.data.loading import load_prompt_dataset
from grpo_fast.trainer.config import SampleRunConfig, load_sample_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, SampleRunConfig)
    parser.add_argument("--output-dir", help="where to write (default: sample.output_dir)")
    parser.add_argument(
        "--overwrite", action="store_true", help="start over in an output directory with other settings"
    )


def main(args: argparse.Namespace) -> int:
    refuse_torchrun("sample")
    overrides = [f"sample.output_dir={args.output_dir}"] if args.output_dir else []
    cfg = load_cli_config(args, overrides, loader=load_sample_config)
    if cfg is None:
        return 0
    try:
        data = load_prompt_dataset(cfg.data.source, prompt_column=cfg.data.prompt_column, **cfg.data.task_kwargs)
        summary = run_sampling(cfg, data.to_list(), overwrite=args.overwrite)
    except ValueError as exc:
        raise SystemExit(f"grpo-fast sample: {exc}") from None
    print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, list)}, indent=2))
    return 0

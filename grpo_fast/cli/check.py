"""`grpo-fast check --config path.yaml [--set key=value ...]`: the checks before a run, alone (verifier
self-test, reward scale, prompt difficulty, baselines; grpo_fast.trainer.preflight)."""

from __future__ import annotations

import argparse

from grpo_fast.cli.train import add_config_arguments, build_trainer, run_checks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)


def main(args: argparse.Namespace) -> int:
    built = build_trainer(args)
    if built is not None:
        cfg, trainer = built
        try:
            run_checks(cfg, trainer)
        finally:
            trainer.close()
    return 0

"""`grpo-fast check --config path.yaml [--set key=value ...]`: the checks before a run, alone (verifier
self-test, reward scale, prompt difficulty, baselines; grpo_fast.trainer.preflight)."""

from __future__ import annotations

import argparse

from grpo_fast.cli.train import add_config_arguments, build_trainer, run_checks


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="the checks before a run: verifier self-test, reward scale, difficulty")
    add_config_arguments(p)
    p.set_defaults(func=_check, command_name="check")


def _check(args: argparse.Namespace) -> int:
    built = build_trainer(args)
    if built is not None:
        cfg, trainer = built
        try:
            run_checks(cfg, trainer)
        finally:
            trainer.close()
    return 0

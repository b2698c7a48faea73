"""`grpo-fast train --config path.yaml [--set key=value ...] [--resume | --overwrite]`: the launch checklist of
grpo_fast.trainer.preflight first (printed; a resumed run checks its verifiers only; --skip-checks: none), then
training.
`--help-config` prints every key of the config with its type, default, bounds and help."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from grpo_fast.core.checkpoint import UnsafeCheckpointError, latest_checkpoint
from grpo_fast.core.config_tree import help_text
from grpo_fast.distributed.context import launched_world_size
from grpo_fast.trainer.config import TrainConfig, load_config
from grpo_fast.trainer.launch import launch_checks, trainer_from_config
from grpo_fast.trainer.preflight import PreflightError


def add_config_arguments(parser: argparse.ArgumentParser, tree: type = TrainConfig) -> None:
    """--config, --set, --print-config and --help-config (shared with the other commands that read a config tree)."""
    parser.add_argument("--config", help=f"YAML file with the {tree.__name__} tree (--help-config lists its keys)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key, e.g. --set run.max_steps=50 (repeatable)",
    )
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument(
        "--help-config", action="store_true", help="print every config key with its type, default and help, and exit"
    )
    parser.set_defaults(config_tree=tree)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in run.output_dir")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in a run.output_dir that holds an earlier run, deleting its checkpoints and metrics",
    )
    parser.add_argument(
        "--skip-checks", action="store_true", help="start training without the launch checklist (health.preflight)"
    )


def load_cli_config(args: argparse.Namespace, extra_overrides: list[str] = (), loader=load_config):
    """The config of --config and --set (then `extra_overrides`), or None after --print-config / --help-config;
    an invalid config exits with the message."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if args.help_config:
        print(help_text(args.config_tree), end="")
        return None
    try:
        cfg = loader(args.config, [*args.overrides, *extra_overrides])
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"grpo-fast {args.command_name}: invalid config: {exc}") from None
    if args.print_config:
        print(json.dumps(dataclasses.asdict(cfg), indent=2, default=repr))  # a callable reward, as its repr
        return None
    return cfg


def build_trainer(args: argparse.Namespace):
    """(config, trainer) from the command line, or None after --print-config / --help-config."""
    cfg = load_cli_config(args, flag_overrides(args))
    if cfg is None:
        return None
    if not cfg.model.path:
        raise SystemExit(f"grpo-fast {args.command_name}: model.path is required")
    try:
        return cfg, trainer_from_config(cfg)
    except ValueError as exc:  # a model path, dataset or reward the config names that cannot be used
        raise SystemExit(f"grpo-fast {args.command_name}: {exc}") from None


def refuse_torchrun(command: str) -> None:
    """Ends a command that runs in one process when a torchrun launch started it on several: each process would do
    the whole work into the same files."""
    world_size = launched_world_size()
    if world_size > 1:
        raise SystemExit(
            f"grpo-fast {command}: runs in one process, and this launch started {world_size} (WORLD_SIZE): each "
            "would do all of the work into the same files. Start it with `grpo-fast` or `python -m grpo_fast.cli`, "
            "not torchrun (`grpo-fast train` is the command that trains over torchrun ranks)"
        )


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The config keys that --resume, --overwrite and --skip-checks set."""
    flags = {"resume": "run.resume=true", "overwrite": "run.overwrite=true", "skip_checks": "health.preflight=false"}
    return [override for name, override in flags.items() if getattr(args, name, False)]


def run_checks(cfg, trainer) -> None:
    """The launch checklist, printed; a broken reward ends the command with the reason."""
    try:
        report = launch_checks(cfg, trainer)
    except PreflightError as exc:
        trainer.close()
        raise SystemExit(f"grpo-fast: the run would learn a broken reward, not starting: {exc}") from None
    if trainer.dist.is_main:  # under torchrun every rank runs the checklist; one prints it
        print(report.text())


def main(args: argparse.Namespace) -> int:
    built = build_trainer(args)
    if built is None:
        return 0
    cfg, trainer = built
    try:
        try:  # before the checklist starts the engine: an earlier run in the way, another run's checkpoint
            trainer.check_output_dir()
        except ValueError as exc:
            raise SystemExit(f"grpo-fast {args.command_name}: {exc}") from None
        if cfg.health.preflight and not cfg.run.resume:  # printed here; a resumed run's train() checks the verifiers
            run_checks(cfg, trainer)
        last = trainer.train()
    except UnsafeCheckpointError as exc:  # refused unread: nothing of it ran, nothing was changed
        checkpoint = latest_checkpoint(trainer.output_dir / "checkpoints")
        raise SystemExit(f"grpo-fast {args.command_name}: cannot resume from {checkpoint}: {exc}") from None
    finally:
        trainer.close()
    if trainer.dist.is_main:
        print(json.dumps({k: v for k, v in last.items() if k.startswith(("reward/mean", "eval/"))}))
    return 0

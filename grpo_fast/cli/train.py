"""`grpo-fast train --config path.yaml [--set key=value ...] [--resume | --overwrite]`: the checks of
grpo_fast.trainer.preflight first (skipped when resuming, or with --skip-checks), then training."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os


def add_config_arguments(
    parser: argparse.ArgumentParser,
    config_help: str = "YAML file with the TrainConfig tree (model, data, reward, rollout, loss, grpo, ...)",
) -> None:
    """--config, --set and --print-config (shared with the other commands that read a config tree)."""
    parser.add_argument("--config", help=config_help)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key, e.g. --set run.max_steps=50 (repeatable)",
    )
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="GRPO training from a YAML config (see configs/)")
    add_config_arguments(p)
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in run.output_dir")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in a run.output_dir that holds an earlier run, deleting its checkpoints and metrics",
    )
    p.add_argument("--skip-checks", action="store_true", help="start training without the checks")
    p.set_defaults(func=_train, command_name="train")


def load_cli_config(args: argparse.Namespace, extra_overrides: list[str] = ()):
    """The TrainConfig of --config and --set (then `extra_overrides`), or None after --print-config; an
    invalid config exits with the message."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from grpo_fast.trainer.config import load_config

    try:
        cfg = load_config(args.config, [*args.overrides, *extra_overrides])
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"grpo-fast {args.command_name}: invalid config: {exc}") from None
    if args.print_config:
        print(json.dumps(dataclasses.asdict(cfg), indent=2))
        return None
    return cfg


def build_trainer(args: argparse.Namespace):
    """(config, trainer) from the command line, or None after --print-config."""
    cfg = load_cli_config(args, flag_overrides(args))
    if cfg is None:
        return None
    if not cfg.model.path:
        raise SystemExit(f"grpo-fast {args.command_name}: model.path is required")
    try:
        return cfg, trainer_from_config(cfg)
    except ValueError as exc:  # a model path, dataset or reward the config names that cannot be used
        raise SystemExit(f"grpo-fast {args.command_name}: {exc}") from None


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The config keys that --resume and --overwrite set."""
    flags = {"resume": "run.resume=true", "overwrite": "run.overwrite=true"}
    return [override for name, override in flags.items() if getattr(args, name, False)]


def trainer_from_config(cfg):
    """A GRPOTrainer for the model, datasets and rewards `cfg` names."""
    if not cfg.model.path:
        raise ValueError("model.path: required (the policy to train)")
    from grpo_fast.data.loading import load_prompt_dataset
    from grpo_fast.trainer.trainer import GRPOTrainer

    train = load_prompt_dataset(cfg.data.source, prompt_column=cfg.data.prompt_column, **cfg.data.task_kwargs)
    evals = None
    if cfg.data.eval_source:
        evals = load_prompt_dataset(
            cfg.data.eval_source, prompt_column=cfg.data.prompt_column, **cfg.data.eval_task_kwargs
        )
    return GRPOTrainer(cfg.model.path, cfg.reward.funcs, train, config=cfg, eval_dataset=evals)


def run_checks(cfg, trainer) -> None:
    from grpo_fast.data.loading import load_prompt_dataset
    from grpo_fast.trainer.preflight import PreflightError

    control = None
    if cfg.check.sft_control_source:
        control = load_prompt_dataset(cfg.check.sft_control_source).to_list()
    try:
        report = trainer.preflight(control)
    except PreflightError as exc:
        trainer.close()
        raise SystemExit(f"grpo-fast: the run would learn a broken reward, not starting: {exc}") from None
    print(report.text())


def _train(args: argparse.Namespace) -> int:
    built = build_trainer(args)
    if built is None:
        return 0
    cfg, trainer = built
    if not (args.skip_checks or cfg.run.resume):
        run_checks(cfg, trainer)
    try:
        last = trainer.train()
    finally:
        trainer.close()
    print(json.dumps({k: v for k, v in last.items() if k.startswith(("reward/mean", "eval/"))}))
    return 0

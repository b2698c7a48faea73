"""`grpo-fast train --config path.yaml [--set key=value ...] [--resume]`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="GRPO training from a YAML config (see configs/)")
    p.add_argument(
        "--config", help="YAML file with the TrainConfig tree (model, data, reward, rollout, grpo, optim, run)"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key, e.g. --set run.max_steps=50 (repeatable)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in run.output_dir")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from grpo_fast.trainer.config import load_config

    overrides = list(args.overrides) + (["run.resume=true"] if args.resume else [])
    try:
        cfg = load_config(args.config, overrides)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"grpo-fast train: invalid config: {exc}") from None
    if args.print_config:
        print(json.dumps(dataclasses.asdict(cfg), indent=2))
        return 0
    if not cfg.model.path:
        raise SystemExit("grpo-fast train: model.path is required")
    from grpo_fast.data.loading import load_prompt_dataset
    from grpo_fast.trainer.trainer import GRPOTrainer

    train = load_prompt_dataset(cfg.data.source, prompt_column=cfg.data.prompt_column, **cfg.data.task_kwargs)
    evals = None
    if cfg.data.eval_source:
        evals = load_prompt_dataset(
            cfg.data.eval_source, prompt_column=cfg.data.prompt_column, **cfg.data.eval_task_kwargs
        )
    trainer = GRPOTrainer(cfg.model.path, cfg.reward.funcs, train, config=cfg, eval_dataset=evals)
    last = trainer.train()
    print(json.dumps({k: v for k, v in last.items() if k.startswith(("reward/mean", "eval/"))}))
    return 0

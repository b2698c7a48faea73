"""`grpo-fast train --config path.yaml [--set key=value ...]` and `grpo-fast demo --output-dir DIR`."""

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

    from grpo_fast.demo.driver import DemoConfig

    d = subparsers.add_parser("demo", help="tiny local model: cold-start SFT + GRPO on CPU, accuracy before/after")
    defaults = DemoConfig()
    d.add_argument("--output-dir", default=defaults.output_dir)
    d.add_argument("--seed", type=int, default=defaults.seed)
    d.add_argument("--engine", choices=("auto", "vllm", "hf"), default=defaults.engine)
    d.add_argument("--rl-steps", type=int, default=defaults.rl_steps)
    d.add_argument("--sft-steps", type=int, default=defaults.sft_steps)
    d.add_argument("--no-progress", action="store_true")
    d.set_defaults(func=_demo)


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


def _demo(args: argparse.Namespace) -> int:
    from grpo_fast.demo.driver import DemoConfig, main

    cfg = DemoConfig(
        output_dir=args.output_dir,
        seed=args.seed,
        engine=args.engine,
        rl_steps=args.rl_steps,
        sft_steps=args.sft_steps,
        progress=not args.no_progress,
    )
    main(cfg)
    return 0

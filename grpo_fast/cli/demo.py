"""`grpo-fast demo --output-dir DIR`: the tiny local model, cold-start SFT then GRPO (grpo_fast.demo)."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    from grpo_fast.demo.driver import DemoConfig

    d = subparsers.add_parser("demo", help="tiny local model: cold-start SFT + GRPO on CPU, accuracy before/after")
    defaults = DemoConfig()
    d.add_argument("--output-dir", default=defaults.output_dir)
    d.add_argument("--task", choices=("modular", "code"), default=defaults.task)
    d.add_argument(
        "--forge-fraction",
        type=float,
        default=defaults.forge_fraction,
        help="code task: share of completions replaced by answer-forging programs",
    )
    d.add_argument("--seed", type=int, default=defaults.seed)
    d.add_argument("--engine", choices=("auto", "vllm", "hf"), default=defaults.engine)
    d.add_argument("--rl-steps", type=int, default=defaults.rl_steps)
    d.add_argument("--sft-steps", type=int, default=defaults.sft_steps)
    d.add_argument("--no-progress", action="store_true")
    d.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from grpo_fast.demo.driver import DemoConfig, main

    cfg = DemoConfig(
        output_dir=args.output_dir,
        task=args.task,
        forge_fraction=args.forge_fraction,
        seed=args.seed,
        engine=args.engine,
        rl_steps=args.rl_steps,
        sft_steps=args.sft_steps,
        progress=not args.no_progress,
    )
    main(cfg)
    return 0

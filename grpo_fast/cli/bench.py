"""`grpo-fast bench-loss` / `grpo-fast bench-step`: the loss benchmark (grpo_fast.bench.loss) and the GRPO
step benchmark against TRL (grpo_fast.bench.step) from the console script."""

from __future__ import annotations

from grpo_fast.bench import loss, step


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench-loss", help="time and memory of the GRPO loss, side by side with naive")
    loss.add_arguments(parser)
    parser.set_defaults(func=loss.main)
    parser = subparsers.add_parser("bench-step", help="one GRPO training step, side by side with TRL's GRPOTrainer")
    step.add_arguments(parser)
    parser.set_defaults(func=step.main)

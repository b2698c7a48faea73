"""`grpo-fast bench-loss`: the loss benchmark (grpo_fast.bench.loss) from the console script."""

from __future__ import annotations

from grpo_fast.bench import loss


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench-loss", help="time and memory of the GRPO loss, side by side with naive")
    loss.add_arguments(parser)
    parser.set_defaults(func=loss.main)

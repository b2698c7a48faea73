"""`grpo-fast` console script. Each subcommand lives beside the code it drives and registers
itself through a `register(subparsers)` function listed in COMMAND_MODULES."""

from __future__ import annotations

import argparse
import importlib

COMMAND_MODULES = ("benchmarks_cli", "train_cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-fast", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"grpo_fast.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())

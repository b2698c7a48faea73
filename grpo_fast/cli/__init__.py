"""`grpo-fast` console script. One module per command in this package, each with a
`register(subparsers)` function; COMMAND_MODULES lists them."""

from __future__ import annotations

import argparse
import importlib

COMMAND_MODULES = ("train", "check", "demo", "bench", "sample", "filter", "pipeline", "sft")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-fast", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())

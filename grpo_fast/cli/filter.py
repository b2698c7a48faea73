"""`grpo-fast filter --pass-rates DIR/pass_rates.jsonl --output prompts.jsonl [--low 0.1 --high 0.9]`: the
prompts whose measured pass rate lies in the band, as a dataset for `grpo-fast train`, and a histogram
(grpo_fast.curate.filtering)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from grpo_fast.curate.filtering import filter_pass_rates


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pass-rates", required=True, help="pass_rates.jsonl written by `grpo-fast sample`")
    parser.add_argument("--output", required=True, help="JSONL file for the kept dataset rows")
    parser.add_argument("--low", type=float, default=0.1, help="lowest pass rate kept (inclusive)")
    parser.add_argument("--high", type=float, default=0.9, help="highest pass rate kept (inclusive)")
    parser.add_argument("--plot", help="histogram PNG (default: beside --output, <name>_pass_rates.png)")


def main(args: argparse.Namespace) -> int:
    output = Path(args.output)
    plot = args.plot or output.with_name(f"{output.stem}_pass_rates.png")
    try:
        summary = filter_pass_rates(args.pass_rates, output, args.low, args.high, plot)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"grpo-fast filter: {exc}") from None
    print(json.dumps(summary, indent=2))
    return 0

"""`grpo-fast` console script. `COMMANDS` names each command's module, which has `add_arguments(parser)` and
`main(args) -> int`; only the module of the command being run is imported (so `grpo-fast --help` loads no
model library)."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "train": ("grpo_fast.cli.train", "GRPO training from a YAML config (see configs/)"),
    "check": ("grpo_fast.cli.check", "the checks before a run: verifier self-test, reward scale, difficulty"),
    "demo": ("grpo_fast.cli.demo", "tiny local model: cold-start SFT + GRPO on CPU, accuracy before/after"),
    "sample": ("grpo_fast.cli.sample", "K completions per prompt: pass rates + rejection-sampled SFT set"),
    "filter": ("grpo_fast.cli.filter", "keep prompts whose pass rate lies in a band (default 0.1-0.9)"),
    "pipeline": ("grpo_fast.cli.pipeline", "chained stages: cold-start SFT -> RL -> sample -> SFT -> RL (+RM)"),
    "engine": ("grpo_fast.cli.engine", "the engine process of an asynchronous run, started apart (on any host)"),
    "sft": ("grpo_fast.cli.sft", "supervised fine-tuning from a YAML config (see configs/sft_demo.yaml)"),
    "bench-loss": ("grpo_fast.bench.loss", "time and memory of the GRPO loss, side by side with its alternatives"),
    "bench-step": ("grpo_fast.bench.step", "one GRPO training step, side by side with TRL's GRPOTrainer"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the arguments of `command` (the others listed by name and help only)."""
    parser = argparse.ArgumentParser(prog="grpo-fast", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            sub.set_defaults(func=module.main, command_name=name)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())

"""`grpo-fast` console script. `COMMANDS` names each command's module, which has `add_arguments(parser)` and
`main(args) -> int`; only the module of the command being run is imported (so `grpo-fast --help` loads no
model library). Every command takes --log-level / --verbose (`configure_logging`)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import warnings

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
        add_logging_arguments(sub)
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            sub.set_defaults(func=module.main, command_name=name)
    return parser


LOG_LEVELS = ("warning", "info", "debug")


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=None,
        help="what is logged besides results (default warning: warnings and alarms; vLLM's INFO lines, several per "
        "training step, stay off; the environment's VLLM_LOGGING_LEVEL is kept)",
    )
    parser.add_argument(
        "-v", "--verbose", dest="log_level", action="store_const", const="info", help="--log-level info"
    )


def configure_logging(level: str | None) -> None:
    """Our loggers (grpo_fast.*) and vLLM's at `level`. None, the default, prints our own lines only: ours at
    warning; vLLM's at error (as VLLM_LOGGING_LEVEL says when it is set), its deprecation warnings off, and
    transformers' progress bars (writing and loading weights) off, the Hub's download bars kept. vLLM reads
    VLLM_LOGGING_LEVEL when it is imported, in this process and in the engine processes it starts."""
    if level is None:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its start-up notices (LD_PRELOAD, chunked prefill...)
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
        if "transformers" in sys.modules:  # imported by the commands that load models
            _quiet_transformers_progress()
    else:
        os.environ["VLLM_LOGGING_LEVEL"] = level.upper()
    # set before vLLM configures it too: what it logs while it is being imported goes through this logger
    logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())
    if level in ("info", "debug"):  # below warning our lines need a handler (without one Python prints warnings only)
        logging.basicConfig(format="%(message)s")  # the root stays at warning: other libraries' chatter stays off
        logging.getLogger("grpo_fast").setLevel(level.upper())


def _quiet_transformers_progress() -> None:
    """transformers' own progress bars off (each weight save and load shows one), the Hub's downloads' kept."""
    import huggingface_hub.utils
    from transformers.utils import logging as transformers_logging

    downloads = not huggingface_hub.utils.are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()  # the Hub's bars too
    if downloads:
        huggingface_hub.utils.enable_progress_bars()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    configure_logging(args.log_level)
    try:
        return int(args.func(args) or 0)
    finally:
        if "torch.distributed" in sys.modules:  # a command that loaded torch may hold process groups (torchrun)
            from grpo_fast.distributed.context import close_distributed

            close_distributed()


if __name__ == "__main__":
    raise SystemExit(main())

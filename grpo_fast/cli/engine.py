"""`grpo-fast engine --connect HOST:PORT --secret-file FILE`: the engine process of an asynchronous run
(rollout.mode async with rollout.async_engine.launch external), on the trainer's host or another. It proves the
run's secret (the file the trainer logs, or $GRPO_FAST_LINK_SECRET) to the trainer at HOST:PORT, takes its settings
and weights from it, generates until the trainer stops it, and exits when the trainer is gone
(grpo_fast.rollout.async_rollouts)."""

from __future__ import annotations

import argparse
import logging

from grpo_fast.rollout.link_auth import LinkRefused, engine_secret
from grpo_fast.rollout.link_store import parse_address


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--connect", required=True, metavar="HOST:PORT", help="the trainer's address, as it logs it")
    parser.add_argument(
        "--secret-file",
        metavar="FILE",
        help="the run's link secret, the file the trainer logs (mode 0600; default: $GRPO_FAST_LINK_SECRET)",
    )
    parser.add_argument(
        "--model-dir",
        help="this host's copy of the model directory (default: the trainer's path, on a shared file system); the "
        "trainer's weights replace its weights",
    )
    parser.add_argument("--devices", help="this process's GPUs (CUDA_VISIBLE_DEVICES; default: the trainer's setting)")
    parser.add_argument("--threads", type=int, help="CPU threads (default: the trainer's setting)")
    parser.add_argument(
        "--connect-seconds", type=float, default=600.0, help="how long to wait for the trainer to listen (seconds)"
    )


def main(args: argparse.Namespace) -> int:
    from grpo_fast.rollout.async_rollouts import run_engine

    if args.threads is not None and args.threads < 1:
        raise SystemExit(f"grpo-fast engine: --threads: expected a positive count, got {args.threads}")
    try:
        parse_address(args.connect, "--connect")
        secret = engine_secret(args.secret_file)
    except ValueError as exc:
        raise SystemExit(f"grpo-fast engine: {exc}") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        run_engine(
            args.connect,
            secret=secret,
            model_dir=args.model_dir,
            devices=args.devices,
            threads=args.threads,
            connect_seconds=args.connect_seconds,
        )
    except LinkRefused as exc:
        raise SystemExit(f"grpo-fast engine: {exc}") from None
    return 0

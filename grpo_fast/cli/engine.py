"""`grpo-fast engine --connect HOST:PORT`: the engine process of an asynchronous run (rollout.mode async with
rollout.async_engine.launch external), on the trainer's host or another. It takes its settings and weights from
the trainer at HOST:PORT (the address the trainer logs), generates until the trainer stops it, and exits when the
trainer is gone (grpo_fast.rollout.async_rollouts)."""

from __future__ import annotations

import argparse
import logging

from grpo_fast.rollout.engine_link import parse_address


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--connect", required=True, metavar="HOST:PORT", help="the trainer's address, as it logs it")
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

    try:
        parse_address(args.connect, "--connect")
    except ValueError as exc:
        raise SystemExit(f"grpo-fast engine: {exc}") from None
    if args.threads is not None and args.threads < 1:
        raise SystemExit(f"grpo-fast engine: --threads: expected a positive count, got {args.threads}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    run_engine(
        args.connect,
        model_dir=args.model_dir,
        devices=args.devices,
        threads=args.threads,
        connect_seconds=args.connect_seconds,
    )
    return 0

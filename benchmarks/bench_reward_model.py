"""The learned reward model scored through the reward pool, as a training step scores it: seconds per step.

    python benchmarks/bench_reward_model.py [--prompts 16] [--generations 8] [--workers 2] [--batch-size 16]
        [--steps 3] [--out benchmarks/results/reward_model_pool_cpu.json]

The R1 demo's final stage (configs/r1_demo.yaml) in isolation: its tiny random-init sequence classifier
(grpo_fast.core.tiny_models.build_tiny_reward_model) scores prompts x generations completions of the countdown
task (4 characters at most, as the demo generates them) through `RewardSet` with the spec
`{name: reward_model, path: ..., batch_size: B}`: in the reward pool (`--workers` processes, the default), and in
the trainer's process (`in_process: true`) for reference. One untimed step first (the workers start and load the
model), then `--steps` timed steps; a step's time is `submit(...).result()`, what `time/score` measures when
nothing overlaps it. Three variants on the same completions, one after the other in one run: the pool calling the
model once per completion (`batch_size: 1`, what the pool did before functions declared a `batch_option`), the
pool with `batch_size: B`, and in-process; the largest difference of each variant's scores from the first's is
recorded (`max_abs_diff_vs_per_completion`). Only public API, so the same command measures any commit.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from grpo_fast.bench.common import environment_stamp, write_json
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_reward_model, save_tiny
from grpo_fast.data.tasks import countdown_dataset
from grpo_fast.rewards.columns import TrainerState
from grpo_fast.rewards.reward_set import RewardSet


def step_seconds(rewards: RewardSet, rows: list[dict], texts: list[str], steps: int) -> tuple[list[float], list]:
    """Wall seconds of `steps` scorings of `texts` (one per row), after one untimed scoring; the scores."""
    ids = [[1] * len(t) for t in texts]
    state = TrainerState(global_step=0, max_steps=steps)
    first = rewards.submit(rows, texts, ids, state).result()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        scored = rewards.submit(rows, texts, ids, state).result()
        times.append(time.perf_counter() - start)
        assert not scored.failures, scored.failures
    return times, first.per_func[:, 0].tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/reward_model_pool_cpu.json")
    args = parser.parse_args()
    load_at_start = os.getloadavg()

    rng = random.Random(0)
    prompts = countdown_dataset(args.prompts, seed=5)
    rows = [row for row in prompts for _ in range(args.generations)]
    texts = ["".join(rng.choice("0123456789+-*=") for _ in range(rng.randint(1, 4))) for _ in rows]
    results = {}
    with tempfile.TemporaryDirectory() as work:
        tokenizer = build_char_tokenizer()
        path = str(save_tiny(build_tiny_reward_model(tokenizer, seed=1), tokenizer, Path(work) / "rm"))
        spec = {"name": "reward_model", "path": path, "batch_size": args.batch_size}
        reference = None
        for name, specs, workers in (
            ("pool_per_completion", [{**spec, "batch_size": 1}], args.workers),
            ("pool_batched", [spec], args.workers),
            ("in_process", [{**spec, "in_process": True}], 0),
        ):
            rewards = RewardSet(specs, workers=workers, timeout=300)
            try:
                times, scores = step_seconds(rewards, rows, texts, args.steps)
            finally:
                rewards.close()
            reference = scores if reference is None else reference
            diff = max(abs(a - b) for a, b in zip(scores, reference, strict=True))
            results[name] = {
                "seconds_per_step_median": statistics.median(times),
                "seconds_per_step": times,
                "max_abs_diff_vs_per_completion": diff,
            }
            median = statistics.median(times)
            print(f"{name}: {median:.3f} s per step of {len(rows)} completions, scores within {diff:.2e}")
        per_completion = results["pool_per_completion"]["seconds_per_step_median"]
        for name in ("pool_batched", "in_process"):
            results[name]["speedup_vs_per_completion"] = per_completion / results[name]["seconds_per_step_median"]
    payload = {
        "benchmark": "reward_model_pool",
        "command": "python benchmarks/bench_reward_model.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "environment": environment_stamp(packages=("torch", "transformers")),
        "load_average_at_start": load_at_start,
        "completions_per_step": len(rows),
        "workers": args.workers,
        "batch_size": args.batch_size,
        "results": results,
    }
    write_json(args.out, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

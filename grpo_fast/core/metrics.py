"""Run journals: metrics.jsonl (and TensorBoard) through `MetricsLogger`, and JSONL read / atomic rewrite."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

logger = logging.getLogger(__name__)


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of a JSONL journal (metrics.jsonl, audit.jsonl). A last line that is not JSON is what a
    process killed while appending leaves: it is dropped, with a warning. Any other line that is not JSON
    raises ValueError naming the file and line."""
    path = Path(path)
    lines = [(i, line) for i, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    records = []
    for i, line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == lines[-1][0]:
                logger.warning("%s:%d: dropping a partly written last line (%s)", path, i, exc)
                break
            raise ValueError(f"{path}:{i}: not JSON ({exc}); fix or remove the line") from None
    return records


def write_jsonl(path: str | Path, records: list[dict]) -> None:
    """Replaces the journal at `path` with `records`, atomically (a crash leaves the old file or the new)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


class MetricsLogger:
    """metrics.jsonl (and TensorBoard) under `output_dir`; output_dir None keeps the history in memory only
    (the ranks other than 0 of a multi-process run)."""

    def __init__(
        self, output_dir: str | Path | None, tensorboard: bool = True, filename: str = "metrics.jsonl"
    ) -> None:
        self.path = None if output_dir is None else Path(output_dir) / filename
        self.history: list[dict] = []
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path is not None and self.path.exists():  # resumed run: keep the earlier steps (plots cover it all)
            self.history = read_jsonl(self.path)
        self._tb = None
        if tensorboard and self.path is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(Path(output_dir) / "tensorboard"))
            except Exception:  # tensorboard not installed: JSONL only
                self._tb = None

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
        if self._tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "step" and v is not None:
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _clean(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v

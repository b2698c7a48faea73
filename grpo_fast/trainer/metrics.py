"""Metrics sinks: JSONL (always), TensorBoard (when installed and enabled), in-memory history for plots."""

from __future__ import annotations

import json
import math
from pathlib import Path


class MetricsLogger:
    def __init__(self, output_dir: str | Path, tensorboard: bool = True, filename: str = "metrics.jsonl") -> None:
        self.path = Path(output_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.history: list[dict] = []
        if self.path.exists():  # resumed run: keep the earlier steps (plots cover the whole run)
            with open(self.path) as f:
                self.history = [json.loads(line) for line in f if line.strip()]
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(Path(output_dir) / "tensorboard"))
            except Exception:  # tensorboard not installed: JSONL only
                self._tb = None

    def truncate_after(self, step: int) -> None:
        """Drops records past `step` (a resumed run re-logs them)."""
        self.history = [r for r in self.history if r.get("step", 0) <= step]
        with open(self.path, "w") as f:
            for r in self.history:
                f.write(json.dumps(r) + "\n")

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self.history.append(record)
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

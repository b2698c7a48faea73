"""Experiment trackers (`run.report_to`, TRL's `report_to`): every logged step's numbers, the run's config
when it starts and the run report when it ends, through each library's own API. The libraries are optional:
one named but not installed is a ValueError naming `run.report_to` and the package to install, raised when the
config is checked, before the run writes anything. metrics.jsonl is always written (grpo_fast.core.metrics).

- tensorboard: `torch.utils.tensorboard.SummaryWriter` (tensorboard installed), else tensorboardX's, writing
  under output_dir/tensorboard; the config and the report as text.
- wandb: `wandb.init(project, name, dir=output_dir, config)`, `run.log(..., step=)`, the report files as an
  artifact of type "run-report" and the last step's numbers in the run summary. Its own settings apply
  (`WANDB_MODE=offline` keeps it off the network; `wandb sync` uploads later).
- trackio: `trackio.init(project, name, config)`, `trackio.log`, the report as `trackio.Markdown`; stored
  where trackio stores (`TRACKIO_DIR`, default under the Hugging Face cache), shown by `trackio show`.
- mlflow: an experiment named after the project, a run named after the run; the config flattened to
  parameters (and whole as config.json), `log_metrics(..., step=)`, the report files as artifacts. Where:
  `MLFLOW_TRACKING_URI` (a server; `sqlite:///mlflow.db` with the full mlflow package; a `file:` store, which
  MLflow 3 accepts with `MLFLOW_ALLOW_FILE_STORE=true`), else MLflow's default.

A resumed run starts a new tracker run under the same name, from the step it resumed at.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from grpo_fast.config_fields import Auto, option
from grpo_fast.core.config_tree import move_key

logger = logging.getLogger(__name__)

TRACKERS = ("tensorboard", "wandb", "trackio", "mlflow")
TrackerName = Literal["tensorboard", "wandb", "trackio", "mlflow"]
REPORT_TO_HELP = (
    "experiment trackers that get each logged step's metrics, the config and the run report, through their own "
    "API (optional packages): tensorboard, wandb, trackio, mlflow; [] for none (metrics.jsonl is always written); "
    "auto: tensorboard when it is installed"
)
PACKAGES = {"tensorboard": "tensorboard (or tensorboardX)", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow"}


@dataclass
class ReportingOptions:
    """Where a run's progress goes, beside metrics.jsonl: the trackers, a progress bar, PNG plots (the `run`
    section of both trainers)."""

    report_to: list[TrackerName] | Auto = option("auto", REPORT_TO_HELP)
    project: str = option("grpo_fast", "the trackers' project (wandb, trackio; mlflow: the experiment)")
    run_name: str | None = option(None, "the run's name in the trackers (null: the name of output_dir)")
    progress: bool = option(True, "a progress bar")
    plots: bool = option(True, "PNG plots of the metrics")


@dataclass(frozen=True)
class TrackedRun:
    """What a tracker is told about the run: where its files go, its project and name, its config tree."""

    output_dir: Path
    project: str
    name: str
    config: Mapping[str, Any]


class Tracker:
    """One library's run. `log` gets the numeric values of a step; `finish` the run report's files (those that
    exist) and the last step's numbers."""

    name = ""

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        raise NotImplementedError

    def finish(self, report_files: Sequence[Path], summary: Mapping[str, float]) -> None:
        raise NotImplementedError


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, run: TrackedRun) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # torch's writer needs the tensorboard package; tensorboardX has the same API
            from tensorboardX import SummaryWriter
        self.writer = SummaryWriter(str(run.output_dir / "tensorboard"))
        self.writer.add_text("config", _code_block(json.dumps(run.config, indent=2, default=str)), 0)
        self._last_step = 0

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self._last_step = step

    def finish(self, report_files: Sequence[Path], summary: Mapping[str, float]) -> None:
        for path in report_files:
            if path.suffix == ".md":
                self.writer.add_text("run_report", path.read_text(), self._last_step)
        self.writer.close()


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, run: TrackedRun) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=run.project, name=run.name, dir=str(run.output_dir), config=dict(run.config), reinit="create_new"
        )

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def finish(self, report_files: Sequence[Path], summary: Mapping[str, float]) -> None:
        self.run.summary.update(dict(summary))
        if report_files:
            artifact = self.wandb.Artifact(f"run-report-{self.run.id}", type="run-report")
            for path in report_files:
                artifact.add_file(str(path))
            self.run.log_artifact(artifact)
        self.run.finish()


class TrackioTracker(Tracker):
    name = "trackio"

    def __init__(self, run: TrackedRun) -> None:
        import trackio

        self.trackio = trackio
        trackio.init(project=run.project, name=run.name, config=dict(run.config))
        self._last_step = 0

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.trackio.log(dict(scalars), step=step)
        self._last_step = step

    def finish(self, report_files: Sequence[Path], summary: Mapping[str, float]) -> None:
        for path in report_files:
            if path.suffix == ".md":
                self.trackio.log({"run_report": self.trackio.Markdown(path.read_text())}, step=self._last_step)
        self.trackio.finish()


class MlflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, run: TrackedRun) -> None:
        import mlflow

        self.mlflow = mlflow
        mlflow.set_experiment(run.project)
        self.run = mlflow.start_run(run_name=run.name)
        params = flatten(run.config)
        items = [(k, json.dumps(v, default=str)[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):  # MLflow takes at most 100 parameters per call
            mlflow.log_params(dict(items[start : start + 100]))
        mlflow.log_dict(dict(run.config), "config.json")

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.mlflow.log_metrics(dict(scalars), step=step)

    def finish(self, report_files: Sequence[Path], summary: Mapping[str, float]) -> None:
        for path in report_files:
            self.mlflow.log_artifact(str(path))
        self.mlflow.end_run()


_CLASSES = {tracker.name: tracker for tracker in (TensorBoardTracker, WandbTracker, TrackioTracker, MlflowTracker)}
_MODULES = {
    "tensorboard": ("tensorboard", "tensorboardX"),
    "wandb": ("wandb",),
    "trackio": ("trackio",),
    "mlflow": ("mlflow",),
}


def installed(name: str) -> bool:
    """Whether the library of tracker `name` can be imported (tensorboard: the tensorboard package, for torch's
    writer, or tensorboardX)."""
    return any(importlib.util.find_spec(module) is not None for module in _MODULES[name])


def resolve_report_to(report_to: Sequence[str] | str) -> list[str]:
    """The trackers `run.report_to` names: a list as it is; "auto" is tensorboard when installed, else none."""
    if report_to == "auto":
        return ["tensorboard"] if installed("tensorboard") else []
    return list(dict.fromkeys(report_to))


def check_installed(report_to: Sequence[str] | str) -> None:
    """ValueError naming run.report_to when a tracker it names cannot be imported: part of checking the config,
    so that the run stops before it starts, in one line."""
    missing = [name for name in resolve_report_to(report_to) if not installed(name)]
    if missing:
        raise ValueError(
            f"run.report_to: {missing} named, but not installed; pip install "
            f"{' '.join(PACKAGES[m] for m in missing)}, or remove them from run.report_to"
        )


def open_trackers(run_section, config: Mapping[str, Any]) -> list[Tracker]:
    """Starts a run in each tracker that `run_section.report_to` names (see resolve_report_to), for the run of
    `run_section` (output_dir, project, run_name) and its whole `config` tree; ValueError naming
    run.report_to when a library is not installed (`check_installed`, for all before any starts)."""
    output_dir = Path(run_section.output_dir)
    run = TrackedRun(output_dir, run_section.project, run_section.run_name or output_dir.resolve().name, config)
    names = resolve_report_to(run_section.report_to)
    check_installed(names)
    trackers = [_CLASSES[name](run) for name in names]
    if trackers:
        logger.info("reporting to %s", ", ".join(t.name for t in trackers))
    return trackers


def scalars_of(record: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics record, "step" left out (strings, lists and None are JSONL's only)."""
    return {
        k: float(v)
        for k, v in record.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys ("run.max_steps"), lists and other leaves as they are."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _code_block(text: str) -> str:
    """Text that TensorBoard's Markdown view shows as it is."""
    return "\n".join("    " + line for line in text.splitlines())


def upgrade_tensorboard(data: dict) -> list[str]:
    """run.tensorboard (true / false), the old spelling of run.report_to, rewritten in place: true is "auto"
    (TensorBoard when installed, what it meant), false is []. A warning when it was there."""
    if not move_key(data, "run.tensorboard", "run.report_to"):
        return []
    value = data["run"]["report_to"]
    if isinstance(value, bool):
        data["run"]["report_to"] = "auto" if value else []
    return [
        "run.tensorboard is the old spelling of run.report_to; write run.report_to: auto (TensorBoard when it is "
        "installed, what true meant), [tensorboard] to require it, or [] for none"
    ]

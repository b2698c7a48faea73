"""run.report_to: each step's metrics, the config and the run report reach TensorBoard, wandb (offline), trackio
and MLflow (local stores) through each library's own API, read back with that library (or its file format);
the old spelling run.tensorboard still works. A library that is not installed skips its test, saying so, and
naming it in run.report_to is an error naming the key.

The runs are `grpo-fast train` subprocesses (each library keeps a global current run; its stores are set by
environment variables read at import), two steps of the tiny model."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_fast.core import trackers
from grpo_fast.sft.config import load_sft_config
from grpo_fast.trainer import load_config

STEPS = 2


def _train(tmp_path: Path, tiny_dir: Path, report_to, env: dict | None = None) -> Path:
    """A two-step `grpo-fast train` run reporting to `report_to`; its output directory."""
    out = tmp_path / "run"
    cfg = {
        "model": {"path": str(tiny_dir)},
        "data": {"source": "task:modular_arithmetic", "task_kwargs": {"n": 8, "seed": 0}, "use_chat_template": False},
        "reward": {"funcs": ["exact_match"], "workers": 0},
        "rollout": {"engine": "hf", "num_generations": 2, "max_completion_length": 2},
        "run": {"max_steps": STEPS, "prompts_per_step": 2, "eval_every": 0, "save_final": False, "plots": False},
        "health": {"audit_every": 0},
    }
    cfg["run"] |= {"progress": False, "output_dir": str(out), "report_to": report_to, "project": "tracked"}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-c", "import sys; from grpo_fast.cli import main; sys.exit(main(sys.argv[1:]))"]
    cmd += ["train", "--config", str(config), "--skip-checks"]
    run_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _logged(out: Path) -> dict[int, dict[str, float]]:
    """The numbers of each step of metrics.jsonl, as the trackers are given them."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: trackers.scalars_of(r) for r in records}


def _read_back(code: str, env: dict) -> dict:
    """Runs `code` (which prints one JSON document) in a fresh interpreter with `env`; the document."""
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _assert_same_metrics(found: dict[int, dict[str, float]], logged: dict[int, dict[str, float]]) -> None:
    assert sorted(found) == sorted(logged) == list(range(1, STEPS + 1))
    for step, numbers in logged.items():
        assert numbers and set(found[step]) == set(numbers), step
        assert found[step] == pytest.approx(numbers, rel=1e-6, abs=1e-9), step


# -- TensorBoard ------------------------------------------------------------------------------------------


def _tfrecords(path: Path):
    """The records of a TFRecord file (TensorBoard's event files): length, its CRC, data, the data's CRC."""
    data = path.read_bytes()
    at = 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        yield data[at + 12 : at + 12 + length]
        at += 12 + length + 4


def _tensorboard_events(out: Path) -> tuple[dict[int, dict[str, float]], dict[str, str]]:
    """(scalars by step, text by tag) of the run's TensorBoard event files."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event
    except ImportError:
        from tensorboardX.proto.event_pb2 import Event
    scalars: dict[int, dict[str, float]] = {}
    texts: dict[str, str] = {}
    for file in sorted((out / "tensorboard").glob("events.out.tfevents.*")):
        for record in _tfrecords(file):
            event = Event.FromString(record)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(event.step, {})[value.tag] = value.simple_value
                elif value.metadata.plugin_data.plugin_name == "text":
                    texts[value.tag.split("/")[0]] = value.tensor.string_val[0].decode()
    return scalars, texts


def test_tensorboard_gets_the_metrics_the_config_and_the_report(tmp_path, tiny_dir):
    if not trackers.installed("tensorboard"):
        pytest.skip("neither tensorboard nor tensorboardX is installed")
    out = _train(tmp_path, tiny_dir, ["tensorboard"])
    scalars, texts = _tensorboard_events(out)
    logged = _logged(out)
    assert sorted(scalars) == list(range(1, STEPS + 1))
    for step, numbers in logged.items():  # event files keep float32
        assert set(scalars[step]) == set(numbers) and scalars[step] == pytest.approx(numbers, rel=1e-6, abs=1e-6)
    assert '"max_steps": 2' in texts["config"] and '"report_to": [' in texts["config"]
    assert texts["run_report"] == (out / "report.md").read_text()


# -- wandb (offline) -------------------------------------------------------------------------------------

WANDB_READ = """
import json, pathlib, struct, sys
from wandb.proto import wandb_internal_pb2
# The run's transaction log (run-<id>.wandb): a 7-byte header, then LevelDB-log records in 32 KiB blocks,
# each piece with a 7-byte header (CRC, length, kind: 1 whole, 2 first, 3 middle, 4 last).
(path,) = pathlib.Path(sys.argv[1]).glob("wandb/offline-run-*/run-*.wandb")
data, at, pieces, records = path.read_bytes(), 7, [], []
while at + 7 <= len(data):
    room = 32768 - at % 32768
    _, length, kind = struct.unpack("<IHB", data[at : at + 7])
    if room < 7 or (length == 0 and kind == 0):  # the padding at a block's end
        at += room
        continue
    pieces.append(data[at + 7 : at + 7 + length])
    at += 7 + length
    if kind in (1, 4):
        records.append(wandb_internal_pb2.Record.FromString(b"".join(pieces)))
        pieces = []
history, config, summary, artifacts = {}, {}, {}, []
for record in records:
    kind = record.WhichOneof("record_type")
    if kind == "history":
        items = record.history.item
        row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in items}
        history[record.history.step.num] = {k: v for k, v in row.items() if not k.startswith("_")}  # wandb's own
    elif kind == "run":
        config = {u.key: json.loads(u.value_json) for u in record.run.config.update}
        name, project = record.run.display_name, record.run.project
    elif kind == "summary":
        summary |= {"/".join(u.nested_key) or u.key: json.loads(u.value_json) for u in record.summary.update}
    elif kind == "artifact":
        artifacts.append([entry.path for entry in record.artifact.manifest.contents])
found = dict(history=history, config=config, summary=summary, artifacts=artifacts, name=name, project=project)
print(json.dumps(found))
"""


def test_wandb_offline_gets_the_metrics_the_config_and_the_report(tmp_path, tiny_dir):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb)")
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CACHE_DIR": str(tmp_path / "cache")}
    out = _train(tmp_path, tiny_dir, ["wandb"], env)
    found = _read_back(WANDB_READ.replace("sys.argv[1]", repr(str(out))), env)
    logged = _logged(out)
    _assert_same_metrics({int(k): v for k, v in found["history"].items()}, logged)
    assert (found["project"], found["name"]) == ("tracked", "run")
    assert found["config"]["run"]["max_steps"] == STEPS and found["config"]["run"]["report_to"] == ["wandb"]
    assert found["summary"]["loss"] == pytest.approx(logged[STEPS]["loss"])
    assert any({"report.md", "report.html"} <= set(paths) for paths in found["artifacts"])


# -- trackio (local store) ---------------------------------------------------------------------------------

TRACKIO_READ = """
import json
from trackio.sqlite_storage import SQLiteStorage
(name,) = SQLiteStorage.get_runs("tracked")
logs = SQLiteStorage.get_logs("tracked", name)
history = {}
for row in logs:
    numbers = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k not in ("step", "timestamp")}
    history.setdefault(row["step"], {}).update(numbers)
    if "run_report" in row:
        report = row["run_report"]
config = SQLiteStorage.get_run_config("tracked", name)
print(json.dumps({"name": name, "history": history, "config": config, "report": report}, default=str))
"""


def test_trackio_gets_the_metrics_the_config_and_the_report(tmp_path, tiny_dir):
    pytest.importorskip("trackio", reason="trackio is not installed (pip install trackio)")
    env = {"TRACKIO_DIR": str(tmp_path / "trackio")}
    out = _train(tmp_path, tiny_dir, ["trackio"], env)
    found = _read_back(TRACKIO_READ, env)
    _assert_same_metrics({int(k): v for k, v in found["history"].items()}, _logged(out))
    assert found["name"] == "run" and found["config"]["run"]["max_steps"] == STEPS
    assert found["report"] == {"_type": "trackio.markdown", "_value": (out / "report.md").read_text()}


# -- MLflow (local store) --------------------------------------------------------------------------------

MLFLOW_READ = """
import json
from mlflow.tracking import MlflowClient
client = MlflowClient()
(run,) = client.search_runs([client.get_experiment_by_name("tracked").experiment_id])
history = {}
for key in run.data.metrics:
    for m in client.get_metric_history(run.info.run_id, key):
        history.setdefault(m.step, {})[key] = m.value
artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
print(json.dumps({"name": run.info.run_name, "history": history, "params": run.data.params, "artifacts": artifacts}))
"""


def test_mlflow_gets_the_metrics_the_config_and_the_report(tmp_path, tiny_dir):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow-skinny)")
    # A local file store (mlflow-skinny has no database backend; MLflow 3 wants the file store asked for)
    env = {"MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true"}
    out = _train(tmp_path, tiny_dir, ["mlflow"], env)
    found = _read_back(MLFLOW_READ, env)
    _assert_same_metrics({int(k): v for k, v in found["history"].items()}, _logged(out))
    assert found["name"] == "run" and found["params"]["run.max_steps"] == str(STEPS)
    assert {"report.md", "report.html", "config.json"} <= set(found["artifacts"])


# -- the config -------------------------------------------------------------------------------------------


def test_run_tensorboard_is_the_old_spelling_of_run_report_to(caplog):
    assert load_config(None, ["run.tensorboard=false"]).run.report_to == []
    assert load_config(None, ["run.tensorboard=true"]).run.report_to == "auto"
    assert load_sft_config(None, ["run.tensorboard=false"]).run.report_to == []
    assert "run.tensorboard is the old spelling of run.report_to" in caplog.text
    with pytest.raises(ValueError, match="run.tensorboard: the old spelling of run.report_to; set only run.report_to"):
        load_config(None, ["run.tensorboard=false", "run.report_to=[wandb]"])
    with pytest.raises(AttributeError, match="it is run.report_to now"):
        load_config().run.tensorboard = False


def test_report_to_names_the_key_when_wrong_or_not_installed(tmp_path, monkeypatch):
    expected = r"run.report_to: expected list\[tensorboard \| wandb \| trackio \| mlflow\] or auto, got list"
    with pytest.raises(ValueError, match=expected):
        load_config(None, ["run.report_to=[tensorbord]"])
    monkeypatch.setitem(trackers._MODULES, "wandb", ("grpo_fast_no_such_module",))
    missing = r"run.report_to: \['wandb'\] named, but not installed; pip install wandb"
    with pytest.raises(ValueError, match=missing):  # with the rest of the config, before anything runs
        load_config(None, [f"run.output_dir={tmp_path}", "run.report_to=[wandb]"])
    with pytest.raises(ValueError, match=missing):
        load_sft_config(None, ["run.report_to=[wandb]"])
    run = load_config(None, [f"run.output_dir={tmp_path}"]).run
    run.report_to = ["wandb"]  # set after the check: opening the trackers refuses it too
    with pytest.raises(ValueError, match=missing):
        trackers.open_trackers(run, {})


def test_a_tracker_not_installed_stops_the_train_command_in_one_line_before_it_writes(tmp_path, monkeypatch, tiny_dir):
    from grpo_fast import cli

    monkeypatch.setitem(trackers._MODULES, "wandb", ("grpo_fast_no_such_module",))
    out = tmp_path / "run"
    args = [
        "train",
        "--set",
        f"model.path={tiny_dir}",
        "--set",
        f"run.output_dir={out}",
        "--set",
        "run.report_to=[wandb]",
    ]
    with pytest.raises(SystemExit) as stopped:
        cli.main(args)
    message = str(stopped.value.code)
    assert "\n" not in message and "run.report_to: ['wandb'] named, but not installed; pip install wandb" in message
    assert not out.exists()
    assert trackers.resolve_report_to("auto") == (["tensorboard"] if trackers.installed("tensorboard") else [])

"""Runs a pipeline: stages in order, each in its own directory, outputs of earlier stages wired into later
ones.

    output_dir: runs/r1
    stages:
      - {name: cold_start, kind: sft, config: {model: {path: my/base}, data: {source: seed.jsonl}}}
      - {name: rl, kind: train, config: {data: {source: task:countdown}, run: {max_steps: 200}}}
      - {name: sample, kind: sample, config: {...}}
      - {name: filter, kind: filter, config: {pass_rates: "${sample.pass_rates}"}}
      - {name: sft, kind: sft, config: {data: {source: "${sample.sft_data}"}}}
      - {name: final, kind: train, skip: false, config: {data: {source: "${filter.prompts}"}}}

- A string "${stage.output}" is replaced by that output of an earlier stage; "${model}" by the latest
  model any earlier stage produced. A stage that takes a model and names none gets the latest model.
- A finished stage leaves `<output_dir>/<name>/stage.json`; running the pipeline again skips it and reuses
  its outputs, and a stage that was interrupted resumes (training from its last checkpoint, sampling from
  its journal, SFT from its checkpoints). stage.json keeps what the stage ran from (its kind, its config with
  the references resolved, the model it was given): a finished stage whose config has changed since is
  refused by name, never reused, and never rerun over its outputs.
- `skip: true` leaves a stage out; its `outputs:` (optional) stand in for what it would have produced.
- At the end, one table of every stage (status, seconds, headline numbers) in summary.md / summary.json.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from grpo_fast.core.checkpoint import UnsafeCheckpointError
from grpo_fast.core.config_tree import read_yaml
from grpo_fast.curate.journal import write_atomic
from grpo_fast.pipeline.stages import STAGE_KINDS, StageResult, check_stage_config, stage_outputs

logger = logging.getLogger(__name__)

_REFERENCE = re.compile(r"\$\{([A-Za-z0-9_\-]+)(?:\.([A-Za-z0-9_]+))?\}")


@dataclass
class StageSpec:
    name: str
    kind: str
    config: dict = field(default_factory=dict)
    skip: bool = False
    outputs: dict = field(default_factory=dict)


@dataclass
class PipelineConfig:
    output_dir: str
    stages: list[StageSpec]


def load_pipeline_config(source: str | Path | dict) -> PipelineConfig:
    """A PipelineConfig from a YAML file or a dict; ValueError naming the stage and key on a bad entry."""
    data = source if isinstance(source, dict) else read_yaml(source) or {}
    unknown = sorted(set(data) - {"output_dir", "stages"})
    if unknown:
        raise ValueError(f"pipeline: unknown key(s) {unknown}; valid keys: ['output_dir', 'stages']")
    if not isinstance(data.get("stages"), list) or not data["stages"]:
        raise ValueError("pipeline.stages: expected a non-empty list of {name, kind, config}")
    stages, names = [], set()
    for i, entry in enumerate(data["stages"]):
        where = f"pipeline.stages[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a mapping, got {entry!r}")
        bad = sorted(set(entry) - {"name", "kind", "config", "skip", "outputs"})
        if bad:
            raise ValueError(
                f"{where}: unknown key(s) {bad}; valid keys: ['config', 'kind', 'name', 'outputs', 'skip']"
            )
        name = entry.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_\-]+", name) or name in names:
            raise ValueError(f"{where}.name: expected a unique name of letters, digits, _ and -, got {name!r}")
        if entry.get("kind") not in STAGE_KINDS:
            raise ValueError(f"{where}.kind: expected one of {STAGE_KINDS.names()}, got {entry.get('kind')!r}")
        check_stage_config(entry["kind"], entry.get("config") or {}, f"{where} ({name}).config")
        names.add(name)
        stages.append(
            StageSpec(
                name, entry["kind"], entry.get("config") or {}, bool(entry.get("skip")), entry.get("outputs") or {}
            )
        )
    _check_references(stages)
    return PipelineConfig(str(data.get("output_dir", "runs/pipeline")), stages)


def _check_references(stages: list[StageSpec]) -> None:
    """ValueError naming the stage when one of its "${stage.output}" names no earlier stage or an output that
    stage does not give, or its "${model}" comes before any stage that gives a model: before the first stage runs.
    A registered kind's outputs are known only when it runs; a skipped stage gives its `outputs:`."""
    given: dict[str, tuple[str, ...] | None] = {}
    for i, stage in enumerate(stages):
        for name, key in _REFERENCE.findall(json.dumps(stage.config, default=str)):
            where = f"pipeline.stages[{i}] ({stage.name}).config: ${{{name}{'.' + key if key else ''}}}"
            if not key:
                if name != "model":
                    raise ValueError(f"{where}: expected ${{stage.output}} or ${{model}}")
                if not any(outputs is None or "model" in outputs for outputs in given.values()):
                    raise ValueError(f"{where}: no stage before it gives a model")
            elif name not in given:
                raise ValueError(f"{where}: names no earlier stage (earlier stages: {sorted(given)})")
            elif given[name] is not None and key not in given[name]:
                raise ValueError(f"{where}: stage {name} gives {list(given[name])}, not {key!r}")
        given[stage.name] = tuple(stage.outputs) if stage.skip else stage_outputs(stage.kind, stage.config)


def run_pipeline(config: PipelineConfig) -> list[dict]:
    """Runs (or resumes) every stage; returns one summary row per stage and writes summary.md/.json."""
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    context: dict[str, dict[str, str]] = {}
    digests: dict[str, str] = {}  # stage name -> digest of what it ran from (its outputs, if skipped)
    latest_model: str | None = None
    table = []
    for stage in config.stages:
        stage_dir = out / stage.name
        marker = stage_dir / "stage.json"
        t0 = time.perf_counter()
        if stage.skip:
            made_from = {"skipped": dict(stage.outputs)}
            result, status = StageResult(dict(stage.outputs), {}), "skipped"
        elif marker.exists():
            saved = json.loads(marker.read_text())
            made_from = _made_from(stage, context, latest_model, digests)
            _check_unchanged(saved, made_from, marker)
            result, status = StageResult(saved["outputs"], saved["summary"]), "done earlier"
        else:
            made_from = _made_from(stage, context, latest_model, digests)
            logger.info("pipeline: stage %s (%s)", stage.name, stage.kind)
            stage_dir.mkdir(parents=True, exist_ok=True)
            try:
                result = STAGE_KINDS.get(stage.kind)(copy.deepcopy(made_from["config"]), stage_dir, latest_model)
            # bad input, a missing file, a refused checkpoint: one line naming the stage
            except (ValueError, OSError, UnsafeCheckpointError) as exc:
                raise ValueError(f"stage {stage.name} ({stage.kind}): {exc}") from exc
            status = "ran"
            seconds = time.perf_counter() - t0
            summary = {**result.summary, "seconds": seconds}
            write_atomic(
                marker, json.dumps({"outputs": result.outputs, "summary": summary, "made_from": made_from}, indent=2)
            )
            result.summary["seconds"] = seconds
        context[stage.name] = result.outputs
        digests[stage.name] = hashlib.sha256(json.dumps(made_from, sort_keys=True).encode()).hexdigest()[:16]
        latest_model = result.outputs.get("model", latest_model)
        table.append({"stage": stage.name, "kind": stage.kind, "status": status, **result.summary})
    write_atomic(out / "summary.json", json.dumps(table, indent=2))
    write_atomic(out / "summary.md", summary_table(table))
    return table


def _made_from(stage: StageSpec, context: dict, latest_model: str | None, digests: dict[str, str]) -> dict:
    """What a stage runs from: its kind, its config with every reference resolved, the model it is given, and
    the digest of what each stage before it ran from (an earlier stage run again differently changes it)."""
    resolved = _resolve(stage.config, context, latest_model, stage.name)
    made_from = {"kind": stage.kind, "config": resolved, "model": latest_model, "earlier": dict(digests)}
    return json.loads(json.dumps(made_from, default=str))


def _check_unchanged(saved: dict, made_from: dict, marker: Path) -> None:
    """ValueError naming what differs when a finished stage (its stage.json `saved`) ran from something other
    than what the pipeline gives it now. A stage.json written before stages kept `made_from` is not checked."""
    before = saved.get("made_from")
    if before is None or before == made_from:
        return
    changes = [
        f"stage {key.removeprefix('earlier.')} before it ran from something else" if key.startswith("earlier.")
        else f"{key}: {was!r} -> {now!r}"
        for key, was, now in _differences(before, made_from)
    ]  # fmt: skip
    shown = "; ".join(changes[:5]) + ("; ..." if len(changes) > 5 else "")
    raise ValueError(
        f"stage {marker.parent.name} finished earlier from another configuration ({shown}). Its outputs in "
        f"{marker.parent} are kept: to run it again as configured now, move or delete that directory (and those of "
        f"the stages after it); to reuse them, restore the configuration it ran with."
    )


def _differences(before, now, path: str = ""):
    """(dotted key, before, now) for each leaf that differs between two JSON values."""
    if isinstance(before, dict) and isinstance(now, dict):
        for key in sorted(set(before) | set(now)):
            yield from _differences(before.get(key), now.get(key), f"{path}.{key}" if path else key)
    elif before != now:
        yield path, before, now


def summary_table(rows: list[dict]) -> str:
    """A markdown table: stage, kind, status, seconds, then each stage's headline numbers."""
    lines = ["| stage | kind | status | seconds | results |", "|---|---|---|---|---|"]
    for r in rows:
        details = ", ".join(f"{k} {_fmt(v)}" for k, v in r.items() if k not in ("stage", "kind", "status", "seconds"))
        seconds = f"{r['seconds']:.0f}" if "seconds" in r else ""
        lines.append(f"| {r['stage']} | {r['kind']} | {r['status']} | {seconds} | {details} |")
    return "\n".join(lines) + "\n"


def _fmt(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _resolve(value, context: dict, latest_model: str | None, stage: str):
    """`value` with every "${stage.output}" / "${model}" replaced (see module doc)."""
    if isinstance(value, dict):
        return {k: _resolve(v, context, latest_model, stage) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, context, latest_model, stage) for v in value]
    if not isinstance(value, str):
        return value

    def lookup(match: re.Match) -> str:
        name, key = match.group(1), match.group(2)
        if key is None and name == "model":
            if latest_model is None:
                raise ValueError(f"stage {stage}: ${{model}} used before any stage produced a model")
            return latest_model
        if name not in context or key not in context[name]:
            known = {n: sorted(o) for n, o in context.items()}
            raise ValueError(f"stage {stage}: {match.group(0)} names no earlier output; earlier outputs: {known}")
        return str(context[name][key])

    return _REFERENCE.sub(lookup, value)

"""The kinds of pipeline stage. A stage is `fn(config: dict, stage_dir: Path, model: str | None) ->
StageResult`: `config` is the stage's own config (references already resolved), `stage_dir` its
directory, `model` the latest model an earlier stage produced. Outputs are paths later stages can name
("${stage.output}"); an output called "model" becomes the next stages' default model.

- sft: `grpo-fast sft`'s config (grpo_fast.sft); outputs model.
- train: `grpo-fast train`'s config, the checks first (as `grpo-fast train`); outputs model (the final
  checkpoint).
- sample: `grpo-fast sample`'s config; outputs pass_rates, sft_data.
- filter: {pass_rates, low, high}; outputs prompts (the rows in the band), plot.
- mix: {sources: [{source, task_kwargs, columns, max_rows}], seed}: several datasets in one shuffled
  JSONL, each source's rows tagged with constant `columns` (e.g. reward_type: open, to route the reward
  model); outputs prompts.
- tiny_models: {seed, reward_model}: the local tiny policy (and a tiny random sequence classifier as a
  reward model) of grpo_fast.core.tiny_models, for runs without a hub; outputs model (and reward_model).

More kinds: `STAGE_KINDS.register("name", fn)`.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from pathlib import Path

from grpo_fast.core import checkpoint as ckpt
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model, build_tiny_reward_model, save_tiny
from grpo_fast.curate.filtering import filter_pass_rates
from grpo_fast.curate.journal import dumps, write_atomic
from grpo_fast.curate.sampling import run_sampling
from grpo_fast.data.loading import load_prompt_dataset
from grpo_fast.registry import Registry
from grpo_fast.sft.config import load_sft_config
from grpo_fast.sft.trainer import run_sft
from grpo_fast.trainer.config import load_config, load_sample_config
from grpo_fast.trainer.launch import launch_checks, trainer_from_config


@dataclass
class StageResult:
    outputs: dict[str, str]
    summary: dict


STAGE_KINDS = Registry(
    "pipeline stage",
    {
        kind: f"grpo_fast.pipeline.stages:{kind}_stage"
        for kind in ("sft", "train", "sample", "filter", "mix", "tiny_models")
    },
)


# The outputs each built-in kind gives later stages (tiny_models' reward_model only when its config asks for one).
STAGE_OUTPUTS = {
    "sft": ("model",),
    "train": ("model",),
    "sample": ("pass_rates", "sft_data"),
    "filter": ("prompts", "plot"),
    "mix": ("prompts",),
    "tiny_models": ("model", "reward_model"),
}


def stage_outputs(kind: str, config: dict) -> tuple[str, ...] | None:
    """The outputs a stage of `kind` with `config` gives; None for a registered kind (not known before it runs)."""
    if kind == "tiny_models" and not config.get("reward_model"):
        return ("model",)
    return STAGE_OUTPUTS.get(kind)


def check_stage_config(kind: str, config: dict) -> None:
    """ValueError naming the key when a built-in stage's config is wrong, before the first stage runs rather than
    hours later: train / sample / sft configs load as their command loads them (references left unresolved); the
    others' keys and values are checked here. A registered kind checks its own when it runs."""
    if not isinstance(config, dict):
        raise ValueError(f"expected a mapping of the {kind} stage's options, got {config!r}")
    loaders = {"train": load_config, "sample": load_sample_config, "sft": load_sft_config}
    if kind in loaders:
        loaders[kind](copy.deepcopy(config))
    elif kind in _CHECKS:
        _CHECKS[kind](config)


def _check_filter(config: dict) -> None:
    _keys(config, "", {"pass_rates", "low", "high"}, required={"pass_rates"})
    _expect(config, "pass_rates", str, "a path (or a reference such as ${sample.pass_rates})")
    low, high = config.get("low", 0.1), config.get("high", 0.9)
    for key, value in (("low", low), ("high", high)):
        if type(value) not in (int, float) or not 0 <= value <= 1:
            raise ValueError(f"{key}: expected a pass rate between 0 and 1, got {value!r}")
    if low > high:
        raise ValueError(f"low/high: expected low <= high, got {low}, {high}")


def _check_mix(config: dict) -> None:
    _keys(config, "", {"sources", "seed"}, required={"sources"})
    _expect(config, "seed", int, "a whole number")
    sources = config["sources"]
    if not isinstance(sources, list) or not sources:
        raise ValueError(
            f"sources: expected a non-empty list of {{source, task_kwargs, columns, max_rows}}, got {sources!r}"
        )
    for i, spec in enumerate(sources):
        where = f"sources[{i}]."
        if not isinstance(spec, dict):
            raise ValueError(f"sources[{i}]: expected a mapping with a 'source', got {spec!r}")
        _keys(spec, where, {"source", "task_kwargs", "columns", "max_rows"}, required={"source"})
        _expect(spec, "source", str, "a file, a hub dataset or task:<name>", where)
        _expect(spec, "task_kwargs", dict, "a mapping of the task builder's keyword arguments", where)
        _expect(spec, "columns", dict, "a mapping of column -> value added to every row", where)
        _expect(spec, "max_rows", int, "a positive whole number", where)
        if spec.get("max_rows", 1) < 1:
            raise ValueError(f"{where}max_rows: expected a positive whole number, got {spec['max_rows']!r}")


def _check_tiny_models(config: dict) -> None:
    _keys(config, "", {"seed", "reward_model"})
    _expect(config, "seed", int, "a whole number")
    _expect(config, "reward_model", bool, "true or false")


def _keys(config: dict, where: str, valid: set[str], required: frozenset | set = frozenset()) -> None:
    if unknown := sorted(set(config) - valid):
        raise ValueError(f"{where}{unknown[0]}: unknown key; valid keys: {sorted(valid)}")
    if missing := sorted(required - set(config)):
        raise ValueError(f"{where}{missing[0]}: required")


def _expect(config: dict, key: str, kind: type, expected: str, where: str = "") -> None:
    value = config.get(key)
    if value is not None and (type(value) is not kind if kind in (int, bool) else not isinstance(value, kind)):
        raise ValueError(f"{where}{key}: expected {expected}, got {value!r}")


_CHECKS = {"filter": _check_filter, "mix": _check_mix, "tiny_models": _check_tiny_models}


def _with_defaults(config: dict, model: str | None, output_key: tuple[str, str], stage_dir: Path) -> dict:
    """A copy of `config` with model.path (the latest model) and the output directory filled in when absent."""
    data = copy.deepcopy(config)
    if model is not None:
        data.setdefault("model", {}).setdefault("path", model)
    section, key = output_key
    data.setdefault(section, {}).setdefault(key, str(stage_dir))
    return data


def _resume_or_restart(run: dict, stage_dir: Path) -> None:
    """A training stage's run section: resume when its output directory holds checkpoints (incomplete ones too:
    a resume names them, never deletes them). One interrupted before its first checkpoint starts over, replacing
    what it logged, only in the stage's own directory: an output_dir the user named elsewhere keeps their
    run.overwrite (an earlier run there is refused, never deleted unasked)."""
    checkpoints = Path(run["output_dir"]) / "checkpoints"
    run["resume"] = bool(ckpt.saved_steps(checkpoints) or ckpt.incomplete_steps(checkpoints))
    own = Path(run["output_dir"]).resolve().is_relative_to(stage_dir.resolve())
    if own:
        run["overwrite"] = not run["resume"]


def train_stage(config: dict, stage_dir: Path, model: str | None) -> StageResult:
    data = _with_defaults(config, model, ("run", "output_dir"), stage_dir)
    data["run"]["save_final"] = True
    _resume_or_restart(data["run"], stage_dir)
    cfg = load_config(data)
    trainer = trainer_from_config(cfg)
    try:
        if not cfg.run.resume:
            launch_checks(cfg, trainer)
        trainer.train()
        history = trainer.metrics.history
    finally:
        trainer.close()
    if trainer.stopped_by:  # not finished: its model is not the next stage's
        raise ValueError(
            f"train stage in {stage_dir}: stopped at step {trainer.step} on the health alarm(s) "
            f"{', '.join(trainer.stopped_by)} (health.stop_on); its model is not passed on. Read its report.md, "
            "change what it says, and run the pipeline again: the stage resumes from its last checkpoint"
        )
    final = ckpt.latest_checkpoint(Path(cfg.run.output_dir) / "checkpoints")
    return StageResult({"model": str(final)}, {"steps": trainer.step, **_rl_summary(history)})


def _rl_summary(history: list[dict]) -> dict:
    """Held-out accuracy first and last; zero-variance groups at the first step and over the run, and the
    stuck ones among them (all equal and not all right: the prompts that teach nothing)."""
    summary = {}
    evals = [r["eval/accuracy"] for r in history if "eval/accuracy" in r]
    if evals:
        summary |= {"eval_accuracy_first": evals[0], "eval_accuracy_last": evals[-1]}
    steps = [r for r in history if "frac_zero_var_groups" in r]
    if steps:
        summary["frac_zero_var_groups_first"] = steps[0]["frac_zero_var_groups"]
        for key in ("frac_zero_var_groups", "frac_stuck_groups"):
            summary[f"{key}_mean"] = sum(r[key] for r in steps) / len(steps)
    return summary


def sample_stage(config: dict, stage_dir: Path, model: str | None) -> StageResult:
    cfg = load_sample_config(_with_defaults(config, model, ("sample", "output_dir"), stage_dir))
    rows = load_prompt_dataset(cfg.data.source, prompt_column=cfg.data.prompt_column, **cfg.data.task_kwargs)
    s = run_sampling(cfg, rows.to_list())
    keys = ("prompts", "pass_rate_mean", "frac_always_fail", "frac_always_pass", "frac_sometimes", "sft_rows")
    return StageResult({"pass_rates": s["pass_rates"], "sft_data": s["sft_data"]}, {k: s[k] for k in keys})


def filter_stage(config: dict, stage_dir: Path, model: str | None) -> StageResult:
    plot = stage_dir / "pass_rates.png"
    s = filter_pass_rates(
        config["pass_rates"], stage_dir / "prompts.jsonl", config.get("low", 0.1), config.get("high", 0.9), plot
    )
    summary = {k: s[k] for k in ("prompts", "kept", "too_easy", "too_hard")}
    return StageResult({"prompts": s["output"], "plot": str(plot)}, summary)


def sft_stage(config: dict, stage_dir: Path, model: str | None) -> StageResult:
    data = _with_defaults(config, model, ("run", "output_dir"), stage_dir)
    _resume_or_restart(data["run"], stage_dir)
    s = run_sft(load_sft_config(data))
    return StageResult({"model": s["final_model"]}, {k: s[k] for k in ("steps", "final_loss") if k in s})


def mix_stage(config: dict, stage_dir: Path, model: str | None) -> StageResult:
    rows, counts = [], {}
    for i, spec in enumerate(config["sources"]):
        ds = load_prompt_dataset(spec["source"], key=f"sources[{i}].source", **spec.get("task_kwargs", {})).to_list()
        ds = ds[: spec["max_rows"]] if spec.get("max_rows") else ds
        rows += [{**row, **spec.get("columns", {})} for row in ds]
        counts[f"rows_{i}"] = len(ds)
    random.Random(config.get("seed", 0)).shuffle(rows)
    path = stage_dir / "prompts.jsonl"
    stage_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(dumps(r) + "\n" for r in rows))
    return StageResult({"prompts": str(path)}, {"rows": len(rows), **counts})


def tiny_models_stage(config: dict, stage_dir: Path, model: str | None) -> StageResult:
    seed = int(config.get("seed", 0))
    tokenizer = build_char_tokenizer()
    outputs = {"model": str(save_tiny(build_tiny_model(tokenizer, seed=seed), tokenizer, stage_dir / "policy"))}
    if config.get("reward_model", False):
        rm = build_tiny_reward_model(tokenizer, seed=seed + 1)
        outputs["reward_model"] = str(save_tiny(rm, tokenizer, stage_dir / "reward_model"))
    return StageResult(outputs, {})

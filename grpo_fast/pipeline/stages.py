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


def check_stage_config(kind: str, config: dict) -> None:
    """Loads a train / sample / sft stage's config as its command would (references left unresolved), so a
    typo fails before the first stage runs rather than hours later; other kinds are checked when they run."""
    loaders = {"train": load_config, "sample": load_sample_config, "sft": load_sft_config}
    if kind in loaders:
        loaders[kind](copy.deepcopy(config))


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
    unknown = sorted(set(config) - {"pass_rates", "low", "high"})
    if unknown or "pass_rates" not in config:
        raise ValueError(f"filter stage: expected keys pass_rates, low, high; got {sorted(config)}")
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
    sources = config.get("sources")
    if not isinstance(sources, list) or not sources:
        raise ValueError("mix stage: sources: expected a list of {source, task_kwargs, columns, max_rows}")
    rows, counts = [], {}
    for i, spec in enumerate(sources):
        if not isinstance(spec, dict) or "source" not in spec:
            raise ValueError(f"mix stage: sources[{i}]: expected a mapping with a 'source', got {spec!r}")
        ds = load_prompt_dataset(spec["source"], **spec.get("task_kwargs", {})).to_list()
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

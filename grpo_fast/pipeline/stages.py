"""The kinds of pipeline stage. A stage is `fn(config: dict, stage_dir: Path, model: str | None) ->
StageResult`: `config` is the stage's own config (references already resolved), `stage_dir` its
directory, `model` the latest model an earlier stage produced. Outputs are paths later stages can name
("${stage.output}"); an output called "model" becomes the next stages' default model.

- sft: `grpo-fast sft`'s config (grpo_fast.sft); outputs model.
- train: `grpo-fast train`'s config, the checks first (as `grpo-fast train`); outputs model (the final
  checkpoint).
- sample: `grpo-fast sample`'s config; outputs pass_rates, sft_data.
- filter (FilterOptions): the sampled prompts whose pass rate is in [low, high]; outputs prompts, plot.
- mix (MixOptions): several datasets in one shuffled JSONL, each source's rows tagged with constant
  `columns` (e.g. reward_type: open, to route the reward model); outputs prompts.
- tiny_models (TinyModelsOptions): the local tiny policy (and a tiny random sequence classifier as a
  reward model) of grpo_fast.core.tiny_models, for runs without a hub; outputs model (and reward_model).

More kinds: `STAGE_KINDS.register("name", fn)`.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from pathlib import Path

from grpo_fast.config_fields import ConfigSection, build, option
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
    if kind == "tiny_models" and not build(TinyModelsOptions, config).reward_model:
        return ("model",)
    return STAGE_OUTPUTS.get(kind)


def check_stage_config(kind: str, config: dict, key: str) -> None:
    """ValueError naming `key` (the stage's config, e.g. "pipeline.stages[1] (rl).config") and the option in it when
    a built-in stage's config is wrong, before the first stage runs rather than hours later: train / sample / sft
    configs load as their command loads them (references left unresolved), the others build their options. A
    registered kind checks its own when it runs."""
    if not isinstance(config, dict):
        raise ValueError(f"{key}: expected a mapping of the {kind} stage's options, got {config!r}")
    loaders = {"train": load_config, "sample": load_sample_config, "sft": load_sft_config}
    if kind in loaders:
        try:
            loaders[kind](copy.deepcopy(config))
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
    elif kind in STAGE_OPTIONS:
        build(STAGE_OPTIONS[kind], config, key)


@dataclass
class FilterOptions(ConfigSection):
    pass_rates: str = option(help="the sample stage's pass-rate file: a path, or a reference (${sample.pass_rates})")
    low: float = option(0.1, "keep prompts whose pass rate is at least this", low=0, high=1)
    high: float = option(0.9, "keep prompts whose pass rate is at most this", low=0, high=1)

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"low/high: expected low <= high, got {self.low}, {self.high}")


@dataclass
class MixSource(ConfigSection):
    source: str = option(help="a file, a hub dataset or task:<name>")
    task_kwargs: dict = option(factory=dict, help="the task builder's keyword arguments")
    columns: dict = option(factory=dict, help="column -> value, added to every row of this source")
    max_rows: int | None = option(None, "the source's first this many rows (null: all)", low=1)


@dataclass
class MixOptions(ConfigSection):
    sources: list[MixSource] = option(help="the datasets to mix: [{source, task_kwargs, columns, max_rows}]")
    seed: int = option(0, "the shuffle's seed")

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("sources: expected at least one {source, task_kwargs, columns, max_rows}")


@dataclass
class TinyModelsOptions(ConfigSection):
    seed: int = option(0, "the policy's initialisation seed (the reward model's: seed + 1)")
    reward_model: bool = option(False, "also build a tiny random sequence classifier as a reward model")


STAGE_OPTIONS = {"filter": FilterOptions, "mix": MixOptions, "tiny_models": TinyModelsOptions}
"""The options of the built-in kinds that are not a command's config."""


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
    options, plot = build(FilterOptions, config), stage_dir / "pass_rates.png"
    s = filter_pass_rates(options.pass_rates, stage_dir / "prompts.jsonl", options.low, options.high, plot)
    summary = {k: s[k] for k in ("prompts", "kept", "too_easy", "too_hard")}
    return StageResult({"prompts": s["output"], "plot": str(plot)}, summary)


def sft_stage(config: dict, stage_dir: Path, model: str | None) -> StageResult:
    data = _with_defaults(config, model, ("run", "output_dir"), stage_dir)
    _resume_or_restart(data["run"], stage_dir)
    s = run_sft(load_sft_config(data))
    return StageResult({"model": s["final_model"]}, {k: s[k] for k in ("steps", "final_loss") if k in s})


def mix_stage(config: dict, stage_dir: Path, model: str | None) -> StageResult:
    options, rows, counts = build(MixOptions, config), [], {}
    for i, spec in enumerate(options.sources):
        ds = load_prompt_dataset(spec.source, key=f"sources[{i}].source", **spec.task_kwargs).to_list()[: spec.max_rows]
        rows += [{**row, **spec.columns} for row in ds]
        counts[f"rows_{i}"] = len(ds)
    random.Random(options.seed).shuffle(rows)
    path = stage_dir / "prompts.jsonl"
    stage_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(dumps(r) + "\n" for r in rows))
    return StageResult({"prompts": str(path)}, {"rows": len(rows), **counts})


def tiny_models_stage(config: dict, stage_dir: Path, model: str | None) -> StageResult:
    options, tokenizer = build(TinyModelsOptions, config), build_char_tokenizer()
    seed = options.seed
    outputs = {"model": str(save_tiny(build_tiny_model(tokenizer, seed=seed), tokenizer, stage_dir / "policy"))}
    if options.reward_model:
        rm = build_tiny_reward_model(tokenizer, seed=seed + 1)
        outputs["reward_model"] = str(save_tiny(rm, tokenizer, stage_dir / "reward_model"))
    return StageResult(outputs, {})

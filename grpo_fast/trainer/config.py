"""The training configuration: a tree of sections whose fields carry their own type, default, bounds and help
(grpo_fast.config_fields), loaded from YAML and `--set key=value` overrides (grpo_fast.core.config_tree).

Sections: model, data, reward, rollout (with the engines' own sections rollout.vllm, rollout.hf and
rollout.plugins), loss (the fused loss's own `GRPOLossConfig`), grpo (the algorithm around the loss), optim,
run, check, health, curriculum. `grpo-fast train --help-config` prints every key; docs/config.md is generated
from the same fields. `validate` holds the rules between fields; each field's own bounds are checked wherever a
value arrives, from YAML or by assignment.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from grpo_fast.config_fields import MAX_WAIT_SECONDS, Auto, ConfigSection, option
from grpo_fast.core.config_tree import load_tree, move_key
from grpo_fast.core.optim import OptimConfig
from grpo_fast.core.policy import ModelConfig
from grpo_fast.core.trackers import ReportingOptions, check_installed, upgrade_tensorboard
from grpo_fast.curate.sampling import SampleConfig
from grpo_fast.data.tasks import TASKS
from grpo_fast.loss import GRPOLossConfig
from grpo_fast.loss.head import LogitHead
from grpo_fast.registry import import_modules
from grpo_fast.rollout.async_rollouts import AsyncOptions
from grpo_fast.rollout.contract import SCHEDULERS, Scheduler, check_plan, engine_capabilities
from grpo_fast.rollout.hf_engine import HFOptions
from grpo_fast.rollout.partial import PartialOptions
from grpo_fast.rollout.registry import ROLLOUT_ENGINES
from grpo_fast.rollout.rollouts import configured_capabilities
from grpo_fast.rollout.vllm_engine import VLLMOptions
from grpo_fast.sandbox import SandboxConfig
from grpo_fast.trainer.health import ALARMS, HealthThresholds


@dataclass
class DataConfig(ConfigSection):
    """The prompts to train on and to evaluate with."""

    key = "data"
    source: str = option(
        "task:modular_arithmetic",
        f"task:<name> (a built-in task: {', '.join(TASKS)}), a local .jsonl / .parquet / .csv file, or a hub "
        "dataset name",
    )
    task_kwargs: dict = option(help="keyword arguments of the built-in task's builder (n, seed, ...)", factory=dict)
    eval_source: str | None = option(None, "the held-out set, in the same forms as source (null: no evaluation)")
    eval_task_kwargs: dict = option(help="task_kwargs of the held-out set", factory=dict)
    prompt_column: str = option("prompt", "the column holding the prompts (text or chat messages)")
    use_chat_template: bool | Auto = option("auto", "encode prompts through the chat template (auto: when it has one)")
    system_prompt: str | None = option(None, "a system message put before every chat prompt")
    chat_template_kwargs: dict = option(
        help="keyword arguments of the chat template wherever it renders (TRL's chat_template_kwargs, e.g. "
        "{enable_thinking: false})",
        factory=dict,
    )


@dataclass
class RewardConfig(ConfigSection):
    """The reward functions and the process pool that scores them."""

    key = "reward"
    funcs: list = option(
        help="reward specs: names of grpo_fast.rewards.registry (math_accuracy, exact_match, ...), mappings "
        "{name: ..., <option>: value} (in_process: true scores in the trainer's process; when: {column: value} "
        "scores only matching rows), or package.module:function",
        factory=lambda: ["exact_match"],
    )
    weights: list[float] | None = option(None, "one weight per function (null: all 1)")
    workers: int = option(2, "processes of the reward pool (0: score everything in-process)", low=0, high=1024)
    timeout: float = option(
        30.0,
        "seconds one completion may take in one function before it costs its reward",
        low=0,
        low_open=True,
        high=MAX_WAIT_SECONDS,
    )
    failure_reward: float | None = option(
        None,
        "the reward of a completion its verifier hung, crashed or raised on (null: the function's lowest reward, "
        "its declared range's, else 0); never a skip",
    )
    max_infra_failures: int = option(
        10,
        "infrastructure failures (a verifier that cannot score: no sandbox, a service down) tolerated over the run; "
        "each one's completion is skipped, one more stops the run with an error",
        low=0,
    )
    sandbox: SandboxConfig = option(
        help="the code sandbox of every reward that takes one (code_tests), unless its spec names its own "
        "(grpo_fast.sandbox.SandboxConfig; backend: remote, url: ... for a SandboxFusion-compatible service)",
        factory=SandboxConfig,
    )
    overlap_chunks: int | Auto = option(
        "auto",
        "generation rounds split into this many chunks, scored while the next generates (1: no overlap; auto: 2 while "
        "the reward pool's work on the last round came to at least a quarter of its generation time, else 1; always 1 "
        "with an engine that seeds each call, not each request: the transformers engine)",
        low=1,
    )


@dataclass
class RolloutConfig(ConfigSection):
    """Sampling, and the engine that samples."""

    key = "rollout"
    MOVED = {name: f"rollout.vllm.{name}" for name in VLLMOptions.__dataclass_fields__}
    engine: str = option(
        "auto",
        "a registered engine (vllm, hf, a plug-in), package.module:Class, or auto (by model size and hardware: "
        "grpo_fast.rollout.registry.choose_engine)",
    )
    num_generations: int = option(8, "completions per prompt (G); GRPO needs at least 2", low=2)
    max_completion_length: int = option(32, "tokens per completion at most (also dr_grpo's normaliser)", low=1)
    temperature: float = option(1.0, "sampling temperature, also the loss's (0: greedy)", low=0)
    top_p: float = option(1.0, "nucleus sampling", low=0, low_open=True, high=1)
    top_k: int = option(-1, "top-k sampling (-1: off)", low=-1)
    stop: list[str] = option(help="strings that end a completion (each a single token)", factory=list)
    max_model_len: int = option(512, "prompt + completion tokens at most", low=1)
    mode: Literal["sync", "partial", "async"] = option(
        "sync",
        "sync: a step generates every completion to its end; partial: a step stops once it has its complete groups "
        "and the rest continue in later steps under newer weights (grpo_fast.rollout.partial); async: the engine "
        "generates in its own process while the trainer trains (grpo_fast.rollout.async_rollouts). Every mode runs "
        "every rollout kind and engine that can take part (grpo_fast.rollout.contract)",
    )
    max_staleness: int = option(
        4, "partial / async: weight versions a trained completion may lag the trainer by at most (0: on-policy)", low=0
    )
    stale: Literal["restart", "drop"] = option(
        "restart", "partial / async: a completion past max_staleness restarts from its prompt, or its group is dropped"
    )
    partial: PartialOptions = option(
        help="partial rollouts' options (rollout.mode partial, and async, whose engine process runs them)",
        factory=PartialOptions,
    )
    async_engine: AsyncOptions = option(help="the engine process's options (rollout.mode async)", factory=AsyncOptions)
    tools: list[str] = option(
        help="tools the model may call during a rollout (TRL's `tools`): registered names (rollout.registry TOOLS) or "
        "package.module:function, each with type hints and a Google-style docstring (grpo_fast.rollout.multi_turn)",
        factory=list,
    )
    environment_factory: str | dict | None = option(
        None,
        "TRL's environment_factory: a registered name or package.module:Factory giving one environment per rollout "
        "(its public methods are tools; reset(**row), optional get_reward()), or {name: factory} with each row "
        "naming its own in an `environment` column (grpo_fast.rollout.environments)",
    )
    max_tool_calling_iterations: int | None = option(
        None, "rounds of tool calls per rollout at most (null: until a turn calls no tool or the tokens run out)", low=0
    )
    tool_timeout_seconds: float = option(
        30.0,
        "seconds a tool call may take; past it the model reads an error",
        low=0,
        low_open=True,
        high=MAX_WAIT_SECONDS,
    )
    tool_workers: int = option(
        1,
        "rollouts whose sync tool calls run at once: 1 runs them in the trainer's thread one after another, as TRL "
        "does (a tool may use signal.alarm); more runs them on that many threads, each call in a daemon thread of "
        "its own (grpo_fast.rollout.tools)",
        low=1,
    )
    rollout_func: str | None = option(
        None,
        "TRL's rollout_func(prompts, trainer) -> {prompt_ids, completion_ids, logprobs, ...}, package.module:function: "
        "a custom agent that produces the completions itself (grpo_fast.rollout.generation.CustomRollouts)",
    )
    vllm: VLLMOptions = option(help="the vLLM engine's options", factory=VLLMOptions)
    hf: HFOptions = option(help="the transformers engine's options", factory=HFOptions)
    plugins: dict = option(
        help="options of plug-in engines, by the name rollout.engine gives them, checked against the engine's own "
        "options section",
        factory=dict,
    )

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler `mode` names: where rollout.mode is read (grpo_fast.rollout.contract)."""
        return SCHEDULERS[self.mode]


_LOSS_OPTIONS = {name: f"loss.{name}" for name in GRPOLossConfig.__dataclass_fields__}
_OLD_CORRECTION = "grpo.vllm_importance_sampling_correction / _mode / _clip_max"


@dataclass
class AlgorithmConfig(ConfigSection):
    """The algorithm around the loss (the loss's own options are the `loss` section). TRL's names.

    Rollout correction (grpo_fast.trainer.importance): importance weights π_old / π_engine from the engine's
    sampling logprobs, per token or one per sequence (exp of the summed log-ratio), clamped to [clip_min,
    clip_max] (truncate) or set to 0 outside it (mask). old_logprobs "rollout" makes the engine the old policy (no
    extra forward, but the ratio then also carries the engine/trainer numeric mismatch, which clipping treats as
    policy change). On-policy (num_iterations 1, no correction) no old-logprob pass runs: the ratio is 1 by
    construction. Adaptive entropy (Skywork-OR1): loss.entropy_coef is the initial coefficient, applied only
    while the last step's mean entropy was <= entropy_target, moved by ±entropy_coef_delta after every step
    within [entropy_coef_min, entropy_coef_max]."""

    key = "grpo"
    MOVED = {
        **_LOSS_OPTIONS,
        "is_correction": _OLD_CORRECTION,
        "is_cap": "grpo.vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_cap": "grpo.vllm_importance_sampling_clip_max",
    }
    scale_rewards: Literal["group", "batch", "none"] = option(
        "group", "advantage scaling: by the group's reward std, the batch's, or none (Dr. GRPO)"
    )
    num_iterations: int = option(1, "policy updates per generation (μ)", low=1)
    dynamic_sampling: bool = option(False, "DAPO: replace groups whose rewards are all equal with new prompts")
    max_resample_rounds: int = option(2, "dynamic sampling: extra generation rounds at most", low=0)
    mask_truncated_completions: bool = option(False, "truncated completions get no loss")
    overlong_buffer: int = option(
        0, "DAPO's soft overlong penalty over this many tokens before max_completion_length (0: off)", low=0
    )
    overlong_penalty_factor: float = option(1.0, "the overlong penalty at the length limit (negated)", low=0)
    vllm_importance_sampling_correction: bool = option(
        False, "importance weights against the engine's sampling logprobs (TRL's default True; costs a forward)"
    )
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = (
        option("sequence_mask", "per-token or per-sequence ratios, truncated or masked outside the bounds")
    )
    vllm_importance_sampling_clip_max: float | None = option(
        3.0, "upper bound of the weights (null: none)", low=0, low_open=True
    )
    vllm_importance_sampling_clip_min: float | None = option(None, "lower bound of the weights (null: none)", low=0)
    use_adaptive_entropy: bool = option(False, "the adaptive entropy coefficient (Skywork-OR1)")
    entropy_coef_min: float = option(0.0, "adaptive entropy: the coefficient's floor", low=0)
    entropy_coef_max: float = option(1.0, "adaptive entropy: the coefficient's ceiling", low=0)
    entropy_coef_delta: float = option(0.005, "adaptive entropy: the step of the coefficient", low=0)
    entropy_target: float = option(0.2, "adaptive entropy: the target mean entropy", low=0)
    old_logprobs: Literal["recompute", "rollout"] = option(
        "recompute", "where the old policy's logprobs come from when needed: a forward pass, or the engine's"
    )

    def rollout_correction(self) -> tuple[str, float | None, float | None] | None:
        """(mode, clip_min, clip_max) of the importance weights against the engine, or None when off."""
        if not self.vllm_importance_sampling_correction:
            return None
        return self.vllm_importance_sampling_mode, self.vllm_importance_sampling_clip_min, self.clip_max

    @property
    def clip_max(self) -> float | None:
        return self.vllm_importance_sampling_clip_max


@dataclass
class RunConfig(ConfigSection, ReportingOptions):
    """The run: batch shape, micro-batches, output, checkpoints, logging.

    Micro-batches: with packing the sequences are concatenated padding-free into micro-batches of at most
    micro_batch_tokens tokens; without it, micro_batch_size padded sequences per forward. As in TRL, bnpo's
    token mean and the entropy bonus are each micro-batch's own, and a micro-batch weighs by its share of the
    batch's sequences."""

    key = "run"
    MOVED = {"tensorboard": "run.report_to"}
    output_dir: str = option("runs/train", "checkpoints, metrics, plots and the run report")
    max_steps: int = option(100, "training steps", low=1)
    prompts_per_step: int = option(16, "prompts per step (x rollout.num_generations completions)", low=1)
    micro_batch_size: int = option(64, "sequences per padded micro-batch", low=1)
    micro_batch_tokens: int | None = option(
        None, "tokens per packed micro-batch (null: micro_batch_size x the batch's longest sequence)", low=1
    )
    packing: bool | Auto = option(
        "auto",
        "pack sequences padding-free (auto: where the packing probe finds the model keeps them apart and the packed "
        "layout costs fewer FLOPs than the padded one, always with a variable-length attention kernel)",
    )
    packed_attention: Literal["auto", "model", "per_sequence"] = option(
        "auto",
        "attention of a packed row: model (the model's own implementation: flash-attn's variable-length kernels, "
        "or sdpa / eager over the whole row with a block-diagonal mask), per_sequence (each sequence's own causal "
        "sdpa, gathered into a padded batch), auto (model where it is variable-length, else per_sequence)",
    )
    share_prompt: bool | Auto = option(
        False, "run each group's prompt through the backbone once (auto: when the prompts are long enough to pay)"
    )
    seed: int = option(0, "seed of sampling, data order and initialisation", low=0, high=2**32 - 1)
    eval_every: int = option(10, "steps between held-out evaluations (0: none)", low=0)
    eval_max_prompts: int | None = option(None, "held-out prompts per evaluation (null: all)", low=1)
    log_every: int = option(1, "steps between progress lines", low=1)
    save_every: int = option(0, "steps between checkpoints (0: only the final one)", low=0)
    save_final: bool = option(True, "save a checkpoint at the end")
    save_best: bool = option(
        True,
        "keep the model of the best held-out evaluation in output_dir/best_model (weights, tokenizer and best.json; "
        "replaced whenever an evaluation beats it)",
    )
    keep_checkpoints: int | None = option(
        None, "keep the newest K checkpoints (null: all; the one resumed from is never deleted)", low=1
    )
    resume: bool = option(False, "continue from the latest checkpoint under output_dir")
    overwrite: bool = option(False, "a fresh run in an output_dir of an earlier run deletes that run's files")
    offload_optimizer: bool = option(True, "optimizer state to pinned CPU memory during generation (GPU)")
    offload_params: bool = option(False, "parameters to pinned CPU memory during generation (GPU)")
    bf16: bool | Auto = option("auto", "bf16 autocast (auto: on GPU, off on CPU)")
    max_bad_steps: int = option(
        3,
        "a step with a non-finite loss or gradient skips its update; this many in a row stop the run (0: never)",
        low=0,
    )


@dataclass
class CheckConfig(ConfigSection):
    """The launch checklist (grpo_fast.trainer.preflight)."""

    key = "check"
    difficulty_prompts: int = option(16, "prompts of the difficulty probe (0: skip it)", low=0)
    difficulty_samples: int = option(8, "completions per prompt of the difficulty probe", low=0)
    sft_control_source: str | None = option(None, "prompt/completion rows for an SFT-control baseline")
    sft_control_steps: int = option(60, "steps of the SFT-control baseline", low=0)


@dataclass
class HealthConfig(ConfigSection, HealthThresholds):
    """Alarms during the run (grpo_fast.trainer.health) and the audit trail."""

    key = "health"
    preflight: bool = option(
        True,
        "run the launch checklist when train() starts, unless it ran already: verifier start-up checks and "
        "self-test, reward scale, prompt difficulty, baselines (a resumed run: the verifier checks only)",
    )
    stop_on: list[Literal[ALARMS]] = option(help="alarms that save a checkpoint and end the run", factory=list)
    audit_every: int = option(10, "steps between audit-trail entries (0: none)", low=0)
    audit_samples: int = option(2, "best and worst completions kept per entry", low=0)


@dataclass
class CurriculumConfig(ConfigSection):
    """The online pass-rate curriculum (grpo_fast.trainer.curriculum)."""

    key = "curriculum"
    every: int = option(0, "steps between pass-rate probes (0: off); the first runs before step 0", low=0)
    low: float = option(0.1, "train only on prompts whose pass rate is at least this", low=0, high=1)
    high: float = option(0.9, "... and at most this", low=0, high=1)
    samples: int = option(8, "completions per prompt of a probe", low=1)
    max_prompts: int | None = option(None, "prompts probed at most, drawn at random (null: all)", low=1)


@dataclass
class TrainConfig(ConfigSection):
    """The whole run (TRL's GRPOConfig's role), as sections."""

    MOVED = {"sample": "a section of the `sample` command's config (SampleRunConfig, load_sample_config)"}
    imports: list[str] = option(
        help="modules imported before the rest of the config is read, so that the plug-ins they register (loss "
        "types, objectives, backends, rollout engines, rewards, tools) can be named like built-ins",
        factory=list,
    )
    model: ModelConfig = option(help="the policy", factory=ModelConfig)
    data: DataConfig = option(help="prompts", factory=DataConfig)
    reward: RewardConfig = option(help="rewards", factory=RewardConfig)
    rollout: RolloutConfig = option(help="sampling", factory=RolloutConfig)
    loss: GRPOLossConfig = option(help="the fused loss", factory=GRPOLossConfig)
    grpo: AlgorithmConfig = option(help="the algorithm around the loss", factory=AlgorithmConfig)
    optim: OptimConfig = option(help="the optimizer", factory=OptimConfig)
    run: RunConfig = option(help="the run", factory=RunConfig)
    check: CheckConfig = option(help="the launch checklist", factory=CheckConfig)
    health: HealthConfig = option(help="alarms", factory=HealthConfig)
    curriculum: CurriculumConfig = option(help="the pass-rate curriculum", factory=CurriculumConfig)

    def __post_init__(self) -> None:
        validate(self)

    def loss_config(self) -> GRPOLossConfig:
        """The `loss` section with what the rollout decides: the sampling temperature (greedy = 1) and
        max_completion_length (dr_grpo's normaliser)."""
        return dataclasses.replace(
            self.loss,
            temperature=self.rollout.temperature if self.rollout.temperature > 0 else 1.0,
            max_completion_length=self.rollout.max_completion_length,
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class SampleRunConfig(TrainConfig):
    """`grpo-fast sample`'s tree: a training config (model, data, reward, rollout) and the `sample` section."""

    MOVED = {}
    sample: SampleConfig = option(help="sampling and rejection", factory=SampleConfig)


def validate(cfg: TrainConfig) -> None:
    """The rules between fields (each field's own type and bounds are checked where it is set); ValueError
    naming the key."""
    r, g = cfg.rollout, cfg.grpo
    import_modules(cfg.imports)
    if r.max_completion_length >= r.max_model_len:
        raise ValueError(
            f"rollout.max_completion_length: {r.max_completion_length} leaves no room for the prompt in "
            f"rollout.max_model_len ({r.max_model_len}); lower it or raise rollout.max_model_len"
        )
    for key, value in (("data.prompt_column", cfg.data.prompt_column), ("data.source", cfg.data.source)):
        if not value.strip():
            raise ValueError(f"{key}: expected a non-empty string")
    if cfg.data.eval_source is not None and not cfg.data.eval_source.strip():  # it turned evaluation off silently
        raise ValueError("data.eval_source: expected a non-empty string, or null for no evaluation")
    if cfg.data.prompt_column != "prompt" and cfg.data.source.startswith("task:"):
        raise ValueError(
            f"data.prompt_column: {cfg.data.prompt_column!r} names a column of your own dataset; the built-in task "
            f"{cfg.data.source!r} has its prompts in 'prompt' (leave data.prompt_column at its default)"
        )
    if not cfg.run.output_dir.strip():
        raise ValueError("run.output_dir: expected a non-empty string")
    check_installed(cfg.run.report_to)
    _check_items("rollout.stop", r.stop, lambda v: v != "", "non-empty strings")
    _check_reward_specs(cfg.reward)
    if r.engine != "auto" and r.engine not in ROLLOUT_ENGINES and ":" not in r.engine:
        raise ValueError(
            f"rollout.engine: expected 'auto', one of {ROLLOUT_ENGINES.names()} or 'package.module:Class', "
            f"got {r.engine!r}"
        )
    for key in ("task_kwargs", "eval_task_kwargs", "chat_template_kwargs"):
        if names := [k for k in getattr(cfg.data, key) if not isinstance(k, str)]:
            raise ValueError(f"data.{key}: expected keyword names (strings), got {names[0]!r}")
    if cfg.loss.temperature != 1.0:
        raise ValueError("loss.temperature: set by rollout.temperature (the loss must see the sampling temperature)")
    try:
        LogitHead(cfg.loss.logit_scale, cfg.loss.final_logit_softcapping).tile(cfg.loss_config().temperature)
    except ValueError as exc:
        raise ValueError(f"rollout.{exc}") from None
    if cfg.loss.max_completion_length is not None:
        raise ValueError("loss.max_completion_length: set by rollout.max_completion_length")
    _check_objective_inputs(cfg)
    if g.overlong_buffer >= r.max_completion_length:
        raise ValueError("grpo.overlong_buffer: expected 0 <= overlong_buffer < rollout.max_completion_length")
    _check_rollout_correction(g)
    if r.scheduler.rounds and r.partial.correction == "coupled" and g.vllm_importance_sampling_correction:
        raise ValueError(
            "rollout.partial.correction: 'coupled' takes the behaviour logprobs as the old policy; with "
            "grpo.vllm_importance_sampling_correction (the decoupled correction) set one of them to none / false"
        )
    if r.scheduler.rounds and g.old_logprobs == "rollout" and r.partial.correction in ("decoupled", "none"):
        raise ValueError(
            f"grpo.old_logprobs: 'rollout' makes the behaviour logprobs the old policy, which is the coupled "
            f"correction, not rollout.partial.correction {r.partial.correction!r} (rollout.mode {r.mode}); set "
            "rollout.partial.correction: coupled (or mask), or grpo.old_logprobs: recompute"
        )
    if (r.tools or r.environment_factory) and r.rollout_func:
        raise ValueError("rollout.rollout_func: a custom rollout function replaces the tool loop; set tools or it")
    engine = None
    if r.scheduler.engine_process and r.engine != "auto":
        engine = engine_capabilities(r.engine, ROLLOUT_ENGINES.get(r.engine))
    check_plan(r.scheduler, configured_capabilities(r), engine)
    if g.entropy_coef_min > g.entropy_coef_max:
        raise ValueError(
            f"grpo.entropy_coef_min: ({g.entropy_coef_min}) must be <= entropy_coef_max ({g.entropy_coef_max})"
        )
    if g.use_adaptive_entropy and cfg.loss.top_entropy_quantile < 1.0:
        raise ValueError(
            "grpo.use_adaptive_entropy: not supported with loss.top_entropy_quantile < 1 (TRL measures the "
            "entropy over the kept tokens; this controller measures all completion tokens)"
        )
    if not cfg.curriculum.low <= cfg.curriculum.high:
        raise ValueError(
            f"curriculum.low / curriculum.high: expected low <= high, got {cfg.curriculum.low}, {cfg.curriculum.high}"
        )


def _check_objective_inputs(cfg: TrainConfig) -> None:
    """An objective that reads the engine's logprobs (icepop, kpop, ipo) needs sampled ones, and corrects for the
    train/inference mismatch itself: no second correction on top."""
    objective, r, g = cfg.loss.objective_spec, cfg.rollout, cfg.grpo
    if not objective.needs_rollout_logprobs:
        return
    if r.temperature == 0:
        raise ValueError(
            f"rollout.temperature: the objective {objective.name!r} reads the engine's sampling logprobs, which "
            "greedy decoding (temperature 0) does not give; set rollout.temperature > 0"
        )
    if g.vllm_importance_sampling_correction or g.old_logprobs == "rollout":
        raise ValueError(
            f"grpo.vllm_importance_sampling_correction / grpo.old_logprobs: the objective {objective.name!r} corrects "
            "against the engine's logprobs itself; set vllm_importance_sampling_correction: false and old_logprobs: "
            "recompute"
        )
    if r.mode != "sync" and r.partial.correction in ("decoupled", "coupled"):
        raise ValueError(
            f"rollout.partial.correction: the objective {objective.name!r} corrects against the engine's logprobs "
            f"itself; set it to none or mask, got {r.partial.correction!r}"
        )


def _check_reward_specs(reward: RewardConfig) -> None:
    if not reward.funcs:
        raise ValueError("reward.funcs: expected at least one reward function")
    _check_items(
        "reward.funcs",
        reward.funcs,
        _is_reward_spec,
        "reward names, {name: ..., <option>: value} mappings or callables",
    )
    if reward.weights is not None and len(reward.weights) != len(reward.funcs):
        raise ValueError(f"reward.weights: {len(reward.weights)} weights for {len(reward.funcs)} reward functions")


def _is_reward_spec(value: Any) -> bool:
    named = isinstance(value, dict) and isinstance(value.get("name"), str)
    return callable(value) or (isinstance(value, str) and value != "") or named


def _check_rollout_correction(g: AlgorithmConfig) -> None:
    """TRL's checks of the vllm_importance_sampling_* options (GRPOConfig.__post_init__), naming the key."""
    clip_min, clip_max = g.vllm_importance_sampling_clip_min, g.vllm_importance_sampling_clip_max
    if clip_min is not None and clip_max is not None and clip_min >= clip_max:
        raise ValueError(
            f"grpo.vllm_importance_sampling_clip_min: ({clip_min}) must be less than "
            f"vllm_importance_sampling_clip_max ({clip_max})"
        )
    truncate = g.vllm_importance_sampling_mode.endswith("_truncate")
    if g.vllm_importance_sampling_correction and truncate and clip_min is None and clip_max is None:
        raise ValueError(
            "grpo.vllm_importance_sampling_mode: a *_truncate mode needs vllm_importance_sampling_clip_min or _clip_max"
        )
    if g.old_logprobs == "rollout" and g.vllm_importance_sampling_correction:
        raise ValueError(
            "grpo.old_logprobs: 'rollout' makes the engine the old policy; "
            "set grpo.vllm_importance_sampling_correction: false"
        )


def _check_items(key: str, values: list, ok, expected: str) -> None:
    for i, value in enumerate(values):
        if not ok(value):
            raise ValueError(f"{key}[{i}]: expected {expected}, got {value!r}")


def upgrade_spellings(data: dict) -> list[str]:
    """Old spellings of a TrainConfig dict rewritten in place to the current ones; a warning per change."""
    warnings = []
    for name in VLLMOptions.__dataclass_fields__:
        warnings += move_key(data, f"rollout.{name}", f"rollout.vllm.{name}")
    warnings += move_key(data, "grpo.vllm_importance_sampling_cap", "grpo.vllm_importance_sampling_clip_max")
    warnings += upgrade_tensorboard(data)
    warnings += _upgrade_sandbox(data)
    grpo = data.get("grpo")
    if isinstance(grpo, dict) and ("is_correction" in grpo or "is_cap" in grpo):
        warnings.append(_upgrade_is_correction(grpo))
    return warnings


def _upgrade_sandbox(data: dict) -> list[str]:
    """reward.sandbox as a backend name: the section with that backend."""
    reward = data.get("reward")
    if not isinstance(reward, dict) or not isinstance(reward.get("sandbox"), str):
        return []
    backend = reward["sandbox"]
    reward["sandbox"] = {"backend": backend}
    return [f"reward.sandbox: {backend} is the old spelling of reward.sandbox.backend: {backend}; write that"]


def _upgrade_is_correction(grpo: dict) -> str:
    """grpo.is_correction ("none" | "token" | "sequence") with is_cap: the truncate modes with clip_max = is_cap."""
    level, cap = grpo.pop("is_correction", "none"), grpo.pop("is_cap", 2.0)
    if level not in ("none", "token", "sequence"):
        raise ValueError(f"grpo.is_correction: expected one of ('none', 'token', 'sequence'), got {level!r}")
    if level != "none":
        if grpo.get("vllm_importance_sampling_correction"):
            raise ValueError(f"grpo.is_correction: the old spelling of {_OLD_CORRECTION}; set only the new keys")
        grpo["vllm_importance_sampling_correction"] = True
        grpo["vllm_importance_sampling_mode"] = f"{level}_truncate"
        grpo["vllm_importance_sampling_clip_max"] = cap
        grpo["vllm_importance_sampling_clip_min"] = None
    return f"grpo.is_correction / is_cap are the old spelling of {_OLD_CORRECTION}; write those"


def load_config(path: str | Path | dict | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """The TrainConfig of a YAML file or nested dict, then `key=value` overrides (old spellings upgraded)."""
    return load_tree(TrainConfig, path, overrides, upgrades=(upgrade_spellings,))


def load_sample_config(path: str | Path | dict | None = None, overrides: list[str] | None = None) -> SampleRunConfig:
    """The `sample` command's SampleRunConfig, as `load_config`."""
    return load_tree(SampleRunConfig, path, overrides, upgrades=(upgrade_spellings,))


def check_distributed_config(cfg: TrainConfig, world_size: int) -> None:
    """ValueError naming the key for what a run of `world_size` processes cannot do."""
    tp = cfg.rollout.vllm.tensor_parallel_size
    if world_size % tp:
        raise ValueError(
            f"rollout.vllm.tensor_parallel_size: {tp} needs a torchrun launch of a multiple of {tp} processes (each "
            f"vLLM engine spans {tp} consecutive ranks), not {world_size}"
        )
    if world_size == 1:
        return
    if cfg.run.prompts_per_step % world_size:
        raise ValueError(
            f"run.prompts_per_step: {cfg.run.prompts_per_step} prompts do not split evenly over {world_size} "
            f"processes; use a multiple of {world_size} (each rank generates and trains on an equal share)"
        )
    if cfg.curriculum.every > 0:
        raise ValueError("curriculum.every: the pass-rate curriculum runs in a single process only; set it to 0")
    if cfg.check.sft_control_source is not None and cfg.health.preflight:
        raise ValueError(
            "check.sft_control_source: the SFT-control baseline trains a copy of the policy in one process, not the "
            "sharded one; leave it null under torchrun (run it with `grpo-fast check` in one process)"
        )
    check_plan(cfg.rollout.scheduler, configured_capabilities(cfg.rollout), world_size=world_size)


def config_key(cfg: Any, dotted: str) -> Any:
    """The value of a dotted key of a config tree."""
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg

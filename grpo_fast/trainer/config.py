"""The training configuration: a typed dataclass tree, loaded from YAML and `--set key=value` overrides,
validated with errors that name the offending key.

Sections: model, data, reward, rollout, loss (the fused loss's own `GRPOLossConfig`: its options and
defaults are documented once, there), grpo (the algorithm around the loss), optim, run.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpo_fast.loss import GRPOLossConfig
from grpo_fast.rollout.registry import ROLLOUT_ENGINES
from grpo_fast.trainer.health import HealthThresholds


@dataclass
class ModelConfig:
    """path: HF directory or hub name of the policy. dtype: training parameter dtype ("float32" keeps fp32
    master weights; bf16 autocast on GPU is `run.bf16`). attn_implementation: transformers' name
    ("sdpa", "flash_attention_2" for the packed micro-batches on GPU, ...; None: transformers' default).
    liger_kernels: patch the policy with Liger-Kernel's RMSNorm, RoPE and SwiGLU kernels (GPU, needs
    liger-kernel); the lm_head and loss stay grpo_fast's fused path."""

    path: str = ""
    dtype: str = "float32"
    gradient_checkpointing: bool = False
    attn_implementation: str | None = None
    liger_kernels: bool = False


@dataclass
class DataConfig:
    """source: "task:modular_arithmetic" / "task:countdown" (built-in), a local .jsonl/.parquet/.csv, or a hub
    name. task_kwargs go to the built-in task builder. eval_*: the held-out set (same forms).
    use_chat_template: "auto" = when the tokenizer has one."""

    source: str = "task:modular_arithmetic"
    task_kwargs: dict = field(default_factory=dict)
    eval_source: str | None = None
    eval_task_kwargs: dict = field(default_factory=dict)
    prompt_column: str = "prompt"
    use_chat_template: str = "auto"
    system_prompt: str | None = None


@dataclass
class RewardConfig:
    """funcs: reward specs of grpo_fast.rewards.registry: names ("math_accuracy", "exact_match" ...),
    {name: ..., <option>: value} mappings (`in_process: true` scores that function in the trainer's
    process; `when: {column: value or [values]}` scores only the rows that match), or
    "package.module:function"; weights: one per function (default all 1).
    workers: processes of the reward pool (0 scores everything in-process); timeout: seconds one
    completion may take in one function before it costs its reward (failure_reward, None = skipped).
    overlap_chunks: each generation round is split into this many chunks, the pool scoring one chunk
    while the engine generates the next (1: generate everything, then score)."""

    funcs: list = field(default_factory=lambda: ["exact_match"])
    weights: list | None = None
    workers: int = 2
    timeout: float = 30.0
    failure_reward: float | None = None
    overlap_chunks: int = 2


@dataclass
class RolloutConfig:
    """engine: a name of grpo_fast.rollout.registry ("vllm", "hf", a plug-in or "package.module:Class") or
    "auto" (by model size and hardware: grpo_fast.rollout.registry.choose_engine). temperature is also the
    loss's temperature. max_completion_length is also dr_grpo's normaliser. vLLM's options: dtype, max_model_len,
    gpu_memory_utilization, kv_cache_memory_bytes (set it on CPU), sleep_level (between generations on GPU:
    2 discards the weights, which the trainer re-pushes before every generation anyway, where 1 would copy
    them to host memory and back each step; 0 disables), sync_bucket_mb (bound on the weight copies alive
    during a sync). tensor_parallel_size: under torchrun, vLLM engines shared by this many consecutive ranks,
    each holding 1/tensor_parallel_size of the weights (vLLM's external launcher); 1 = an engine per rank."""

    engine: str = "auto"
    num_generations: int = 8
    max_completion_length: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list = field(default_factory=list)
    dtype: str = "auto"
    max_model_len: int = 512
    gpu_memory_utilization: float = 0.3
    kv_cache_memory_bytes: int | None = None
    sleep_level: int = 2
    sync_bucket_mb: int = 256
    tensor_parallel_size: int = 1


@dataclass
class GRPOConfig:
    """The algorithm around the loss (the loss's own options are the `loss` section).

    scale_rewards: "group" | "batch" | "none" (Dr. GRPO). num_iterations: policy updates per generation (μ).
    dynamic_sampling: DAPO's filter of groups whose rewards are all equal, refilling the batch from new
    prompts for at most max_resample_rounds extra generations. mask_truncated_completions: truncated
    completions get no loss. overlong_buffer: DAPO's soft overlong penalty over the last `overlong_buffer`
    tokens before max_completion_length (0 disables), up to -overlong_penalty_factor.
    Rollout correction (TRL's names; grpo_fast.trainer.importance): vllm_importance_sampling_correction turns
    on importance weights π_old / π_engine from the engine's sampling logprobs (any engine that returns them,
    not only vLLM; default False here, TRL's True: it costs an old-logprob forward per step);
    vllm_importance_sampling_mode "token_truncate" | "token_mask" | "sequence_truncate" | "sequence_mask"
    (TRL's default): per-token ratios or one per sequence (exp of the summed log-ratio), clamped to
    [clip_min, clip_max] (truncate) or set to 0 outside it (mask); vllm_importance_sampling_clip_max (3.0) /
    _clip_min (None): the bounds, None = unbounded on that side; vllm_importance_sampling_cap: TRL's
    deprecated name of clip_max (overrides it). is_correction ("none" | "token" | "sequence") with is_cap
    is the older spelling of the truncate modes with clip_max = is_cap.
    Adaptive entropy (Skywork-OR1, TRL's names; grpo_fast.trainer.entropy_control): with use_adaptive_entropy
    the loss's entropy_coef is the initial coefficient, applied only while the last optimizer step's mean
    entropy was <= entropy_target (so not on the first step), and moved after every optimizer step by
    +entropy_coef_delta (entropy <= target) or -entropy_coef_delta, within [entropy_coef_min, entropy_coef_max].
    old_logprobs: where the old policy's logprobs come from when the loss needs them (num_iterations > 1):
    "recompute" (a forward pass of the policy before the first update, once per step) or "rollout" (the
    engine's sampling logprobs, as verl and prime-rl offer: no extra forward at all, but the ratio then
    also carries the engine/trainer numeric mismatch, which clipping treats as policy change; nothing is
    left for is_correction to correct, so it must be "none"). On-policy (num_iterations 1, no
    is_correction) no old-logprob pass runs: the ratio is 1 by construction, and the rollout/trainer
    mismatch metrics come from the training forward.
    """

    scale_rewards: str = "group"
    num_iterations: int = 1
    dynamic_sampling: bool = False
    max_resample_rounds: int = 2
    mask_truncated_completions: bool = False
    overlong_buffer: int = 0
    overlong_penalty_factor: float = 1.0
    is_correction: str = "none"
    is_cap: float = 2.0
    vllm_importance_sampling_correction: bool = False
    vllm_importance_sampling_mode: str = "sequence_mask"
    vllm_importance_sampling_clip_max: float | None = 3.0
    vllm_importance_sampling_clip_min: float | None = None
    vllm_importance_sampling_cap: float | None = None
    use_adaptive_entropy: bool = False
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    entropy_coef_delta: float = 0.005
    entropy_target: float = 0.2

    def rollout_correction(self) -> tuple[str, float | None, float | None] | None:
        """(mode, clip_min, clip_max) of the importance weights against the engine, or None when off."""
        if self.is_correction != "none":
            return f"{self.is_correction}_truncate", None, self.is_cap
        if not self.vllm_importance_sampling_correction:
            return None
        clip_max = self.vllm_importance_sampling_clip_max
        if self.vllm_importance_sampling_cap is not None:
            clip_max = self.vllm_importance_sampling_cap
        return self.vllm_importance_sampling_mode, self.vllm_importance_sampling_clip_min, clip_max

    old_logprobs: str = "recompute"


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    lr_scheduler: str = "constant"
    warmup_steps: int = 0
    max_grad_norm: float = 1.0


@dataclass
class RunConfig:
    """prompts_per_step x num_generations completions per step.

    Micro-batches of the loss step: with packing ("auto": when the probe of grpo_fast.sft.packing_check
    finds that the model keeps packed sequences apart; "true" fails otherwise) the sequences are
    concatenated padding-free into micro-batches of at most micro_batch_tokens tokens (None:
    micro_batch_size x the batch's longest sequence); without it, micro_batch_size padded sequences per
    forward. As in TRL, bnpo's token mean and the entropy bonus (a token mean) are each micro-batch's own, and a
    micro-batch weighs by its share of the batch's sequences (TRL: 1 / gradient_accumulation_steps, equal-row
    micro-batches); so with packing, bnpo depends on how the token budget groups sequences (dapo does not).
    share_prompt: run each group's prompt through the backbone once and reuse its keys/values
    for the G completions ("auto": when the prompts are long enough for it to pay, see
    grpo_fast.trainer.prefix_sharing).
    offload_optimizer / offload_params: trainer state to pinned CPU memory during generation (GPU only).
    bf16: "auto" = autocast on GPU, off on CPU.
    keep_checkpoints: keep only the newest K checkpoints (None: all; TRL's save_total_limit); the one the
    run resumed from is never deleted. resume: continue from the latest checkpoint under output_dir; the
    config must match the checkpoint's in the model, loss and batch shape (trainer/checkpoint.py lists the
    options). overwrite: a fresh run in an output_dir that holds an earlier run's metrics or checkpoints
    deletes them (checkpoints, metrics, audit trail, report, TensorBoard events, plots); without it such a
    run is refused. max_bad_steps: a step whose loss or gradient is NaN/inf skips its optimizer update (and
    its checkpoint) and the run goes on; this many such steps in a row stop the run with an error, the last
    good checkpoint kept (0: never stop)."""

    output_dir: str = "runs/train"
    max_steps: int = 100
    prompts_per_step: int = 16
    micro_batch_size: int = 64
    micro_batch_tokens: int | None = None
    packing: str = "auto"
    share_prompt: str = "false"
    seed: int = 0
    eval_every: int = 10
    eval_max_prompts: int | None = None
    log_every: int = 1
    save_every: int = 0
    save_final: bool = True
    keep_checkpoints: int | None = None
    resume: bool = False
    overwrite: bool = False
    offload_optimizer: bool = True
    offload_params: bool = False
    bf16: str = "auto"
    tensorboard: bool = True
    progress: bool = True
    plots: bool = True
    max_bad_steps: int = 3


@dataclass
class CheckConfig:
    """The checks before a run (grpo_fast.trainer.preflight): difficulty_prompts x difficulty_samples
    completions probe the prompts' pass rates (0 prompts skips it); sft_control_source, a dataset of
    prompt/completion rows, adds an SFT-control baseline trained for sft_control_steps."""

    difficulty_prompts: int = 16
    difficulty_samples: int = 8
    sft_control_source: str | None = None
    sft_control_steps: int = 60


@dataclass
class HealthConfig(HealthThresholds):
    """Alarms during the run (grpo_fast.trainer.health; thresholds documented there). stop_on: alarm names
    that save a checkpoint and end the run. audit_every: steps between audit-trail entries (0 disables);
    audit_samples: best and worst completions kept per entry."""

    stop_on: list = field(default_factory=list)
    audit_every: int = 10
    audit_samples: int = 2


@dataclass
class SampleConfig:
    """`grpo-fast sample` (grpo_fast.curate.sampling): samples_per_prompt completions of each of the first
    max_prompts rows (None: all) at the rollout section's sampling settings, generated and committed
    chunk_prompts at a time (a killed run resumes at the first unfinished chunk). The SFT set keeps the
    verified-correct completions by grpo_fast.curate.rejection's rules: at most max_per_prompt (0: all),
    prefer_shortest, dedupe, drop_truncated, and with `language` set only reasoning whose share in that
    language is at least min_language_share."""

    output_dir: str = "runs/sample"
    samples_per_prompt: int = 8
    max_prompts: int | None = None
    chunk_prompts: int = 64
    max_per_prompt: int = 1
    prefer_shortest: bool = True
    dedupe: bool = True
    drop_truncated: bool = True
    language: str | None = None
    min_language_share: float = 0.95


@dataclass
class CurriculumConfig:
    """The online pass-rate curriculum (grpo_fast.trainer.curriculum): before step 0 and every `every`
    steps (0 disables), samples completions of the training prompts (at most max_prompts of them, drawn at
    random; None: all) and trains only on the prompts whose pass rate lies in [low, high]."""

    every: int = 0
    low: float = 0.1
    high: float = 0.9
    samples: int = 8
    max_prompts: int | None = None


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: GRPOLossConfig = field(default_factory=GRPOLossConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    check: CheckConfig = field(default_factory=CheckConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)

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


_CHOICES = {
    "rollout.dtype": ("auto", "float32", "bfloat16", "float16"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "grpo.scale_rewards": ("group", "batch", "none"),
    "grpo.is_correction": ("none", "token", "sequence"),
    "grpo.vllm_importance_sampling_mode": ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
    "grpo.old_logprobs": ("recompute", "rollout"),
    "optim.lr_scheduler": ("constant", "linear", "cosine"),
    "run.bf16": ("auto", "true", "false"),
    "run.packing": ("auto", "true", "false"),
    "run.share_prompt": ("auto", "true", "false"),
    "data.use_chat_template": ("auto", "true", "false"),
}
_POSITIVE = (
    "rollout.num_generations",
    "rollout.max_completion_length",
    "rollout.max_model_len",
    "rollout.sync_bucket_mb",
    "reward.timeout",
    "reward.overlap_chunks",
    "grpo.num_iterations",
    "run.max_steps",
    "run.prompts_per_step",
    "run.micro_batch_size",
    "run.micro_batch_tokens",
    "run.keep_checkpoints",
    "optim.lr",
    "sample.samples_per_prompt",
    "sample.chunk_prompts",
    "curriculum.samples",
)


_NON_NEGATIVE = (
    "run.save_every",
    "run.eval_every",
    "rollout.kv_cache_memory_bytes",
    "grpo.max_resample_rounds",
    "grpo.overlong_penalty_factor",
    "optim.weight_decay",
    "optim.warmup_steps",
    "check.difficulty_prompts",
    "check.difficulty_samples",
    "check.sft_control_steps",
    "health.audit_every",
    "health.audit_samples",
    "sample.max_per_prompt",
)
_POSITIVE_MORE = ("run.log_every", "optim.eps", "optim.max_grad_norm", "rollout.tensor_parallel_size")
_RANGES = {  # inclusive bounds
    "rollout.top_p": (1e-12, 1.0),
    "rollout.gpu_memory_utilization": (1e-12, 1.0),
    "optim.beta1": (0.0, 1.0 - 1e-12),
    "optim.beta2": (0.0, 1.0 - 1e-12),
    "sample.min_language_share": (0.0, 1.0),
    "run.seed": (0, 2**32 - 1),  # numpy's seed range
}


def validate(cfg: TrainConfig) -> None:
    """Raises ValueError naming the key for a bad value (types are checked by `from_dict`)."""
    check_fields(cfg, _CHOICES, _POSITIVE + _POSITIVE_MORE)
    for key in _NON_NEGATIVE:
        value = _get(cfg, key)
        if value is not None and not value >= 0:
            raise ValueError(f"{key}: expected >= 0, got {value!r}")
    for key, (low, high) in _RANGES.items():
        value = _get(cfg, key)
        if not low <= value <= high:
            raise ValueError(f"{key}: expected a value in [{low:g}, {high:g}], got {value!r}")
    if cfg.rollout.max_completion_length >= cfg.rollout.max_model_len:
        raise ValueError(
            f"rollout.max_completion_length: {cfg.rollout.max_completion_length} leaves no room for the prompt in "
            f"rollout.max_model_len ({cfg.rollout.max_model_len}); lower it or raise rollout.max_model_len"
        )
    if cfg.rollout.top_k < -1:
        raise ValueError(f"rollout.top_k: expected -1 (off) or a positive count, got {cfg.rollout.top_k}")
    for key in ("data.prompt_column", "data.source", "run.output_dir"):
        if not str(_get(cfg, key)).strip():
            raise ValueError(f"{key}: expected a non-empty string")
    _check_items("rollout.stop", cfg.rollout.stop, lambda v: isinstance(v, str) and v != "", "non-empty strings")
    _check_items(
        "reward.funcs",
        cfg.reward.funcs,
        lambda v: (
            callable(v) or (isinstance(v, str) and v != "") or (isinstance(v, dict) and isinstance(v.get("name"), str))
        ),
        "reward names, {name: ..., <option>: value} mappings or callables",
    )
    if not cfg.reward.funcs:
        raise ValueError("reward.funcs: expected at least one reward function")
    if cfg.reward.weights is not None:
        _check_items(
            "reward.weights",
            cfg.reward.weights,
            lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
            "finite numbers",
        )
    engine = cfg.rollout.engine
    if engine != "auto" and engine not in ROLLOUT_ENGINES and ":" not in engine:
        raise ValueError(
            f"rollout.engine: expected 'auto', one of {ROLLOUT_ENGINES.names()} or 'package.module:Class', "
            f"got {engine!r}"
        )
    if cfg.loss.temperature != 1.0:
        raise ValueError("loss.temperature: set by rollout.temperature (the loss must see the sampling temperature)")
    if cfg.loss.max_completion_length is not None:
        raise ValueError("loss.max_completion_length: set by rollout.max_completion_length")
    if cfg.rollout.num_generations < 2:
        raise ValueError("rollout.num_generations: GRPO needs at least 2 completions per prompt")
    if cfg.rollout.sleep_level not in (0, 1, 2):
        raise ValueError(f"rollout.sleep_level: expected 0, 1 or 2, got {cfg.rollout.sleep_level!r}")
    if not 0 <= cfg.rollout.temperature:
        raise ValueError("rollout.temperature: expected >= 0")
    if cfg.reward.weights is not None and len(cfg.reward.weights) != len(cfg.reward.funcs):
        raise ValueError(
            f"reward.weights: {len(cfg.reward.weights)} weights for {len(cfg.reward.funcs)} reward functions"
        )
    if cfg.grpo.overlong_buffer < 0 or cfg.grpo.overlong_buffer >= cfg.rollout.max_completion_length:
        raise ValueError("grpo.overlong_buffer: expected 0 <= overlong_buffer < rollout.max_completion_length")
    alarms = ("entropy_collapse", "length_inflation", "reward_hacking", "off_policy_drift", "collapse")
    for name in cfg.health.stop_on:
        if name not in alarms:
            raise ValueError(f"health.stop_on: expected names among {alarms}, got {name!r}")
    if cfg.health.window < 1:
        raise ValueError(f"health.window: expected a positive value, got {cfg.health.window}")
    if cfg.reward.workers < 0:
        raise ValueError(f"reward.workers: expected >= 0, got {cfg.reward.workers}")
    if cfg.grpo.is_cap <= 0:
        raise ValueError("grpo.is_cap: expected > 0")
    if cfg.grpo.old_logprobs == "rollout" and cfg.grpo.is_correction != "none":
        raise ValueError("grpo.old_logprobs: 'rollout' makes the engine the old policy; set grpo.is_correction: none")
    validate_rollout_correction(cfg)
    validate_adaptive_entropy(cfg)
    for section in ("sample", "curriculum"):
        limit = _get(cfg, f"{section}.max_prompts")
        if limit is not None and limit < 1:
            raise ValueError(f"{section}.max_prompts: expected a positive count or null, got {limit!r}")
    if not 0.0 <= cfg.curriculum.low <= cfg.curriculum.high <= 1.0:
        raise ValueError(
            "curriculum.low / curriculum.high: expected 0 <= low <= high <= 1, got "
            f"{cfg.curriculum.low}, {cfg.curriculum.high}"
        )
    if cfg.run.max_bad_steps < 0:
        raise ValueError(f"run.max_bad_steps: expected >= 0 (0: never stop), got {cfg.run.max_bad_steps}")
    if cfg.curriculum.every < 0:
        raise ValueError(f"curriculum.every: expected >= 0 (0 disables), got {cfg.curriculum.every}")


def validate_rollout_correction(cfg: TrainConfig) -> None:
    """TRL's checks of the vllm_importance_sampling_* options (GRPOConfig.__post_init__), naming the key."""
    g = cfg.grpo
    if g.is_correction != "none" and g.vllm_importance_sampling_correction:
        raise ValueError(
            "grpo.is_correction: the older spelling of grpo.vllm_importance_sampling_correction; set only one"
        )
    for name in ("clip_max", "clip_min", "cap"):
        value = getattr(g, f"vllm_importance_sampling_{name}")
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValueError(
                f"grpo.vllm_importance_sampling_{name}: expected a finite value >= 0 or null, got {value!r}"
            )
    clip_min, clip_max = g.vllm_importance_sampling_clip_min, g.vllm_importance_sampling_clip_max
    if g.vllm_importance_sampling_cap is not None:  # TRL's deprecated name of clip_max
        clip_max = g.vllm_importance_sampling_cap
    if clip_min is not None and clip_max is not None and clip_min >= clip_max:
        raise ValueError(
            f"grpo.vllm_importance_sampling_clip_min: ({clip_min}) must be less than "
            f"vllm_importance_sampling_clip_max ({clip_max})"
        )
    if (
        g.vllm_importance_sampling_correction
        and g.vllm_importance_sampling_mode.endswith("_truncate")
        and clip_min is None
        and clip_max is None
    ):
        raise ValueError(
            "grpo.vllm_importance_sampling_mode: a *_truncate mode needs vllm_importance_sampling_clip_min or _clip_max"
        )
    if g.old_logprobs == "rollout" and g.vllm_importance_sampling_correction:
        raise ValueError(
            "grpo.old_logprobs: 'rollout' makes the engine the old policy; "
            "set grpo.vllm_importance_sampling_correction: false"
        )


def validate_adaptive_entropy(cfg: TrainConfig) -> None:
    """The adaptive entropy controller's options (TRL does not check them; here they must make sense)."""
    g = cfg.grpo
    for name in ("entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target"):
        value = getattr(g, name)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"grpo.{name}: expected a finite value >= 0, got {value!r}")
    if g.entropy_coef_min > g.entropy_coef_max:
        raise ValueError(
            f"grpo.entropy_coef_min: ({g.entropy_coef_min}) must be <= entropy_coef_max ({g.entropy_coef_max})"
        )
    if g.use_adaptive_entropy and cfg.loss.top_entropy_quantile < 1.0:
        raise ValueError(
            "grpo.use_adaptive_entropy: not supported with loss.top_entropy_quantile < 1 (TRL measures the "
            "entropy over the kept tokens; this controller measures all completion tokens)"
        )


def _check_items(key: str, values: list, ok, expected: str) -> None:
    for i, value in enumerate(values):
        if not ok(value):
            raise ValueError(f"{key}[{i}]: expected {expected}, got {value!r}")


def check_fields(cfg, choices: dict[str, tuple[str, ...]], positive: tuple[str, ...]) -> None:
    """Raises ValueError naming the key of the first value outside its `choices` (dotted key -> allowed
    strings, compared lower-case) or not > 0 among the dotted keys `positive` (None passes: unset)."""
    for key, allowed in choices.items():
        value = _get(cfg, key)
        if str(value).lower() not in allowed:
            raise ValueError(f"{key}: expected one of {allowed}, got {value!r}")
    for key in positive:
        value = _get(cfg, key)
        if value is not None and not value > 0:
            raise ValueError(f"{key}: expected a positive value, got {value!r}")


def _get(cfg, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def from_dict(data: dict, cls: type = TrainConfig, prefix: str = ""):
    """Builds `cls` from a nested dict; unknown keys and wrongly typed values raise ValueError."""
    if not isinstance(data, dict):
        raise ValueError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(map(str, set(data) - names))
    if unknown:
        raise ValueError(f"{prefix or 'config'}: unknown key(s) {unknown}; valid keys: {sorted(names)}")
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        kwargs[key] = _coerce(value, hints[key], path)
    try:
        return cls(**kwargs)
    except ValueError as exc:  # a section's own checks (GRPOLossConfig) name the key within the section
        raise ValueError(f"{prefix}.{exc}" if prefix else str(exc)) from None


def _coerce(value: Any, hint: Any, path: str):
    if dataclasses.is_dataclass(hint):
        return from_dict(value or {}, hint, path)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(errors[0])
    target = origin or hint
    if target in (int, float) and isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        raise ValueError(f"{path}: {value} is out of range (beyond a 64-bit integer)")
    if target is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if target is float and isinstance(value, str):
        try:  # YAML 1.1 reads "3e-4" (no dot) as a string
            value = float(value)
        except ValueError:
            raise ValueError(f"{path}: expected float, got str {value!r}") from None
    if target is float and isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{path}: expected a number, got NaN")
    if target is str and isinstance(value, bool):
        return str(value).lower()  # YAML turns `true` into a bool; choice fields take "true"/"false"
    if target in (list, dict, str, int, float, bool):
        if not isinstance(value, target) or (target is int and isinstance(value, bool)):
            raise ValueError(f"{path}: expected {target.__name__}, got {type(value).__name__} {value!r}")
        return value
    return value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """`key.sub=value` strings (value parsed as YAML) merged into the nested dict `data`."""
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ValueError(f"--set {key}: the value {raw!r} is not valid YAML ({_first_line(exc)})") from None
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {part!r} is not a section")
        node[parts[-1]] = value
    return data


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]


def _read_yaml(source: str | Path):
    """The YAML file `source` as Python data; ValueError naming the file for bytes that are not UTF-8 text
    or text that is not YAML."""
    try:
        text = Path(source).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"config file {source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"config file {source}: not valid YAML ({_first_line(exc)})") from None


def load_tree(cls: type, source: str | Path | dict | None = None, overrides: list[str] | None = None):
    """A config dataclass tree `cls` from a YAML file or a nested dict (copied, not modified), then
    `--set key=value` overrides."""
    data: dict = {}
    if isinstance(source, dict):
        data = copy.deepcopy(source)
    elif source is not None:
        data = _read_yaml(source)
        data = {} if data is None else data
    return from_dict(apply_overrides(data, overrides or []), cls)


def load_config(path: str | Path | dict | None = None, overrides: list[str] | None = None) -> TrainConfig:
    return load_tree(TrainConfig, path, overrides)


def check_distributed_config(cfg: TrainConfig, world_size: int) -> None:
    """ValueError naming the key for what a run of `world_size` > 1 processes cannot do."""
    if cfg.run.prompts_per_step % world_size:
        raise ValueError(
            f"run.prompts_per_step: {cfg.run.prompts_per_step} prompts do not split evenly over {world_size} "
            f"processes; use a multiple of {world_size} (each rank generates and trains on an equal share)"
        )
    if cfg.curriculum.every > 0:
        raise ValueError("curriculum.every: the pass-rate curriculum runs in a single process only; set it to 0")
    tp = cfg.rollout.tensor_parallel_size
    if world_size % tp:
        raise ValueError(
            f"rollout.tensor_parallel_size: {tp} does not divide the {world_size} processes (each vLLM engine spans "
            f"{tp} consecutive ranks)"
        )

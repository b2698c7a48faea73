"""The training configuration: a typed dataclass tree, loaded from YAML and `--set key=value` overrides,
validated with errors that name the offending key.

Sections: model, data, reward, rollout, loss (the fused loss's own `GRPOLossConfig`: its options and
defaults are documented once, there), grpo (the algorithm around the loss), optim, run.
"""

from __future__ import annotations

import copy
import dataclasses
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
    during a sync)."""

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


@dataclass
class GRPOConfig:
    """The algorithm around the loss (the loss's own options are the `loss` section).

    scale_rewards: "group" | "batch" | "none" (Dr. GRPO). num_iterations: policy updates per generation (μ).
    dynamic_sampling: DAPO's filter of groups whose rewards are all equal, refilling the batch from new
    prompts for at most max_resample_rounds extra generations. mask_truncated_completions: truncated
    completions get no loss. overlong_buffer: DAPO's soft overlong penalty over the last `overlong_buffer`
    tokens before max_completion_length (0 disables), up to -overlong_penalty_factor.
    is_correction: importance weights trainer/rollout from the engine's logprobs, "none" | "token" |
    "sequence", truncated at is_cap.
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
    forward. share_prompt: run each group's prompt through the backbone once and reuse its keys/values
    for the G completions ("auto": when the prompts are long enough for it to pay, see
    grpo_fast.trainer.prefix_sharing).
    offload_optimizer / offload_params: trainer state to pinned CPU memory during generation (GPU only).
    bf16: "auto" = autocast on GPU, off on CPU.
    keep_checkpoints: keep only the newest K checkpoints (None: all; TRL's save_total_limit); the one the
    run resumed from is never deleted. resume: continue from the latest checkpoint under output_dir; the
    config must match the checkpoint's in the model, loss and batch shape (trainer/checkpoint.py lists the
    options). overwrite: a fresh run in an output_dir that holds an earlier run's metrics or checkpoints
    deletes them (checkpoints, metrics, audit trail, report, TensorBoard events, plots); without it such a
    run is refused."""

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


def validate(cfg: TrainConfig) -> None:
    """Raises ValueError naming the key for a bad value (types are checked by `from_dict`)."""
    check_fields(cfg, _CHOICES, _POSITIVE)
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
    for section in ("sample", "curriculum"):
        limit = _get(cfg, f"{section}.max_prompts")
        if limit is not None and limit < 1:
            raise ValueError(f"{section}.max_prompts: expected a positive count or null, got {limit!r}")
    if not 0.0 <= cfg.curriculum.low <= cfg.curriculum.high <= 1.0:
        raise ValueError(
            f"curriculum.low/high: expected 0 <= low <= high <= 1, got {cfg.curriculum.low}, {cfg.curriculum.high}"
        )
    if cfg.curriculum.every < 0:
        raise ValueError(f"curriculum.every: expected >= 0 (0 disables), got {cfg.curriculum.every}")


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
    unknown = sorted(set(data) - names)
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
    if target is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if target is float and isinstance(value, str):
        try:  # YAML 1.1 reads "3e-4" (no dot) as a string
            return float(value)
        except ValueError:
            raise ValueError(f"{path}: expected float, got str {value!r}") from None
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
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {part!r} is not a section")
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    return data


def load_tree(cls: type, source: str | Path | dict | None = None, overrides: list[str] | None = None):
    """A config dataclass tree `cls` from a YAML file or a nested dict (copied, not modified), then
    `--set key=value` overrides."""
    data: dict = {}
    if isinstance(source, dict):
        data = copy.deepcopy(source)
    elif source is not None:
        with open(source) as f:
            data = yaml.safe_load(f) or {}
    return from_dict(apply_overrides(data, overrides or []), cls)


def load_config(path: str | Path | dict | None = None, overrides: list[str] | None = None) -> TrainConfig:
    return load_tree(TrainConfig, path, overrides)

"""TRL's `GRPOConfig` as a TrainConfig: what `GRPOTrainer(args=trl.GRPOConfig(...))` trains with.

Every field of the GRPOConfig is one of three kinds, and nothing else:

- honoured: it sets the TrainConfig keys of `MAPPED` (a plain translation) or `DERIVED` (read together with other
  fields: the batch, the number of steps, the schedule, the engine, ...), with TRL's meaning;
- inert (`INERT`): it has no counterpart because grpo_fast does the thing anyway, or it belongs to machinery
  grpo_fast does not run (a dataloader, accelerate); any value is accepted, the table says why;
- anything else is not supported, and refused with its name when its value differs from TRL's default (never
  ignored); `HINTS` says what to do instead where there is something.

docs/trl.md is generated from these tables (`markdown_table`), and a test checks that a non-default value of
every field that is not inert either changes the TrainConfig or is refused by name.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import torch

from grpo_fast.trainer.config import TrainConfig, load_config


def _dict(value: Any) -> dict:
    return json.loads(value) if isinstance(value, str) else dict(value or {})


def _same(value: Any) -> Any:
    return value


def _completion_length(value: int | None) -> int:
    if value is None:
        raise _refuse("max_completion_length", None, "grpo_fast needs a number of tokens (TRL's default: 512)")
    return int(value)


def _top_k(value: int | None) -> int:
    return -1 if not value else int(value)  # TRL's 0 (or None) is "off", grpo_fast's -1


_LOSS = (
    "beta",
    "delta",
    "epsilon_high",
    "sapo_temperature_neg",
    "sapo_temperature_pos",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
    "importance_sampling_level",
    "loss_type",
    "top_entropy_quantile",
    "entropy_coef",
    "off_policy_mask_threshold",
    "use_bias_correction_kl",
)
_GRPO = (
    "num_iterations",
    "scale_rewards",
    "mask_truncated_completions",
    "use_adaptive_entropy",
    "entropy_coef_min",
    "entropy_coef_max",
    "entropy_coef_delta",
    "entropy_target",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min",
)

MAPPED: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "output_dir": ("run.output_dir", str),
    "seed": ("run.seed", int),
    "per_device_train_batch_size": ("run.micro_batch_size", int),
    "save_total_limit": ("run.keep_checkpoints", _same),
    "run_name": ("run.run_name", _same),
    "project": ("run.project", str),
    "learning_rate": ("optim.lr", float),
    "weight_decay": ("optim.weight_decay", float),
    "adam_beta1": ("optim.beta1", float),
    "adam_beta2": ("optim.beta2", float),
    "adam_epsilon": ("optim.eps", float),
    "max_grad_norm": ("optim.max_grad_norm", float),
    "gradient_checkpointing": ("model.gradient_checkpointing", bool),
    "use_liger_kernel": ("model.liger_kernels", bool),
    "chat_template_kwargs": ("data.chat_template_kwargs", _dict),
    "num_generations": ("rollout.num_generations", int),
    "max_completion_length": ("rollout.max_completion_length", _completion_length),
    "temperature": ("rollout.temperature", float),
    "top_p": ("rollout.top_p", float),
    "top_k": ("rollout.top_k", _top_k),
    "max_tool_calling_iterations": ("rollout.max_tool_calling_iterations", _same),
    "vllm_gpu_memory_utilization": ("rollout.vllm.gpu_memory_utilization", float),
    "vllm_tensor_parallel_size": ("rollout.vllm.tensor_parallel_size", int),
    "epsilon": ("loss.epsilon_low", float),
    **{name: (f"loss.{name}", _same) for name in _LOSS},
    **{name: (f"grpo.{name}", _same) for name in _GRPO},
}
"""TRL field -> (TrainConfig key, conversion)."""

DERIVED: dict[str, str] = {
    "max_steps": "optimizer steps, as TRL counts them: run.max_steps = max_steps / num_iterations generation "
    "batches (a multiple of num_iterations; -1: num_train_epochs)",
    "num_train_epochs": "when max_steps is -1: num_train_epochs x the dataset's whole generation batches x "
    "num_iterations optimizer steps, as TRL counts them (a multiple of num_iterations)",
    "generation_batch_size": "run.prompts_per_step = generation_batch_size / num_generations",
    "steps_per_generation": "one optimizer step per generation batch: must equal gradient_accumulation_steps",
    "gradient_accumulation_steps": "a generation batch is one optimizer step, in micro-batches (run.micro_batch_size)",
    "use_vllm": "rollout.engine: vllm, else hf (transformers' generate, as TRL without vLLM)",
    "vllm_importance_sampling_correction": "grpo.vllm_importance_sampling_correction when use_vllm (TRL corrects "
    "vLLM's sampling only)",
    "vllm_mode": "colocate (server: not supported)",
    "vllm_max_model_length": "rollout.max_model_len (null: the model's max_position_embeddings)",
    "bf16": "run.bf16",
    "use_cpu": "accepted where there is no GPU (grpo_fast trains on the GPU when there is one)",
    "disable_tqdm": "run.progress = not disable_tqdm",
    "report_to": "run.report_to (none: [])",
    "logging_steps": "run.log_every = ceil(logging_steps / num_iterations) generation batches (TRL counts "
    "optimizer steps; a fraction < 1: of them)",
    "logging_strategy": "steps (other strategies: not supported)",
    "save_strategy": "steps: run.save_every from save_steps, and the final save; no: run.save_every 0, no final save",
    "save_steps": "run.save_every, as logging_steps",
    "eval_strategy": "steps: run.eval_every from eval_steps (null: logging_steps); no: run.eval_every 0",
    "eval_steps": "run.eval_every, as logging_steps",
    "lr_scheduler_type": "optim.lr_scheduler: linear, cosine, constant (warmup ignored, as transformers does), "
    "constant_with_warmup",
    "warmup_steps": "optim.warmup_steps, optimizer steps as in TRL (a fraction < 1: of them)",
    "optim": "AdamW (adamw_torch, adamw_torch_fused)",
    "model_init_kwargs": "dtype (or torch_dtype): model.dtype; attn_implementation: model.attn_implementation; "
    "revision main and trust_remote_code false (TRL's script passes them): their defaults",
    "gradient_checkpointing_kwargs": "null or {use_reentrant: false} (what grpo_fast uses)",
    "reward_weights": "the trainer's reward weights, one per reward function (an environment's reward adds 1)",
    "multi_objective_aggregation": "sum_then_normalize (grpo_fast's: weighted sum, then the group's advantage)",
    "remove_unused_columns": "false: every dataset column reaches the reward functions (true: not supported)",
}
"""TRL fields read together (`_derived`), with what they become."""

INERT: dict[str, str] = {
    "local_rank": "torchrun's environment decides it",
    "do_train": "not used by trainers (scripts' flag)",
    "do_eval": "not used by trainers (scripts' flag)",
    "do_predict": "not used by trainers (scripts' flag)",
    "resume_from_checkpoint": "not used by trainers (scripts' flag); grpo_fast resumes with run.resume",
    "vllm_enable_sleep_mode": "grpo_fast's colocated vLLM sleeps between generations (rollout.vllm.sleep_level)",
    "vllm_importance_sampling_cap": "TRL's deprecated spelling of vllm_importance_sampling_clip_max (folded into it)",
    "log_multimodal": "text models only: nothing to log",
    "accelerator_config": "grpo_fast does not run through accelerate",
    "dataloader_drop_last": "no dataloader: the trainer draws the prompts itself",
    "dataloader_num_workers": "no dataloader: the trainer draws the prompts itself",
    "dataloader_pin_memory": "no dataloader: the trainer draws the prompts itself",
    "dataloader_persistent_workers": "no dataloader: the trainer draws the prompts itself",
    "dataloader_prefetch_factor": "no dataloader: the trainer draws the prompts itself",
    "dataloader_multiprocessing_context": "no dataloader: the trainer draws the prompts itself",
    "dataloader_in_order": "no dataloader: the trainer draws the prompts itself",
    "use_transformers_paged": "TRL's deprecated spelling of use_transformers_continuous_batching (checked there)",
}
"""TRL fields without a counterpart, accepted with any value, and why."""

HINTS: dict[str, str] = {
    "push_to_hub": "push the saved model (trainer.save_model) with huggingface_hub after training",
    "log_completions": "health.audit_every keeps the best and worst completions of a step in the run's audit trail",
    "fp16": "train in bf16 (bf16: true) or float32",
    "min_p": "the rollout engines sample with temperature, top_p and top_k",
    "repetition_penalty": "the rollout engines sample with temperature, top_p and top_k",
    "generation_kwargs": "the rollout engines sample with temperature, top_p and top_k",
    "num_generations_eval": "held-out evaluation decodes one greedy completion per prompt",
    "disable_dropout": "build the model without dropout (its config's dropout probabilities at 0)",
    "use_transformers_continuous_batching": "use_vllm: true, or the transformers engine (use_vllm: false)",
    "deepspeed": "launch with torchrun: grpo_fast shards the model with FSDP2 itself",
    "fsdp": "launch with torchrun: grpo_fast shards the model with FSDP2 itself",
    "sync_ref_model": "the reference policy stays the initial model (loss.beta)",
    "trust_remote_code": "load the model yourself and pass the object",
    "data_seed": "run.seed orders the prompts",
    "shuffle_dataset": "prompts are drawn in a random order seeded by run.seed",
    "cast_lm_head_to_fp32": "the fused loss accumulates the logits in fp32 (its operands in the model's dtype); "
    "for fp32 operands train in float32 (model_init_kwargs dtype)",
}
"""What to do instead, for the unsupported fields people set most."""


def trl_field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _is_default(name: str, value: Any, default: Any) -> bool:
    if name == "debug":
        return not value
    if name == "pad_to_multiple_of":
        return value in (None, "auto")
    return value == default


def trl_config(args, *, num_rows: int | None, model_max_length: int | None) -> tuple[TrainConfig, list | None]:
    """(the TrainConfig, the reward weights) of TRL GRPOConfig `args`; ValueError naming the TRL field that is not
    supported (see module doc) or whose value grpo_fast refuses. `num_rows`: the training rows (for max_steps -1);
    `model_max_length`: the model's max_position_embeddings (rollout.max_model_len unless vllm_max_model_length)."""
    for field in dataclasses.fields(args):
        name = field.name
        if name in MAPPED or name in DERIVED or name in INERT:
            continue
        value = getattr(args, name)
        if not _is_default(name, value, trl_field_default(field)):
            hint = HINTS.get(name, f"leave it at TRL's default ({trl_field_default(field)!r})")
            raise ValueError(f"GRPOConfig.{name}={value!r}: not supported by grpo_fast's GRPOTrainer; {hint}")
    keys = {key: convert(getattr(args, name)) for name, (key, convert) in MAPPED.items()}
    keys.update(_derived(args, num_rows, model_max_length))
    data: dict = {}
    for key, value in keys.items():
        section = data
        *path, last = key.split(".")
        for part in path:
            section = section.setdefault(part, {})
        section[last] = value
    try:
        config = load_config(data)
    except ValueError as exc:
        named = [key for key in keys if key in str(exc)]  # the keys the message names, and the fields that set them
        sources = [name for name, (key, _) in MAPPED.items() if key in named]
        sources += [name for name, what in DERIVED.items() if any(key in what for key in named)]
        raise ValueError(f"{exc} (set from GRPOConfig: {', '.join(sources) or 'its fields'})") from exc
    return config, args.reward_weights


def _refuse(name: str, value: Any, why: str) -> ValueError:
    return ValueError(f"GRPOConfig.{name}={value!r}: {why}")


def _derived(args, num_rows: int | None, model_max_length: int | None) -> dict[str, Any]:
    """The TrainConfig keys of the DERIVED fields."""
    out = {**_batch(args), **_engine(args, model_max_length), **_precision(args), **_model(args)}
    out["data.use_chat_template"] = False  # TRL renders a chat prompt through the template, a string as it is
    updates = _optimizer_steps(args, num_rows, out["run.prompts_per_step"])
    out["run.max_steps"] = updates // args.num_iterations
    out.update(_schedule(args, updates))
    out.update(_logging(args, updates))
    if args.multi_objective_aggregation != "sum_then_normalize":
        raise _refuse("multi_objective_aggregation", args.multi_objective_aggregation, "only sum_then_normalize")
    if args.remove_unused_columns:
        raise _refuse("remove_unused_columns", True, "every column reaches the reward functions; set it to false")
    return out


def _batch(args) -> dict[str, Any]:
    if args.steps_per_generation != args.gradient_accumulation_steps:
        raise _refuse(
            "steps_per_generation",
            args.steps_per_generation,
            f"with generation_batch_size={args.generation_batch_size} and gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps}, a generation batch would feed {args.steps_per_generation} micro-"
            f"batches per {args.gradient_accumulation_steps}-micro-batch optimizer step; grpo_fast takes one "
            "optimizer step per generation batch (per grpo.num_iterations): set gradient_accumulation_steps to "
            "steps_per_generation, or generation_batch_size = per_device_train_batch_size x "
            "gradient_accumulation_steps x processes",
        )
    prompts, rest = divmod(args.generation_batch_size, args.num_generations)
    if rest:  # GRPOConfig refuses it itself; kept for objects built around its checks
        raise _refuse("generation_batch_size", args.generation_batch_size, "must be a multiple of num_generations")
    return {"run.prompts_per_step": prompts}


def _engine(args, model_max_length: int | None) -> dict[str, Any]:
    if args.use_vllm and args.vllm_mode != "colocate":
        raise _refuse("vllm_mode", args.vllm_mode, "grpo_fast runs vLLM colocated (or apart: rollout.mode async)")
    if args.vllm_model_impl != "vllm":
        raise _refuse("vllm_model_impl", args.vllm_model_impl, "grpo_fast runs vLLM's own model implementation")
    out: dict[str, Any] = {
        "rollout.engine": "vllm" if args.use_vllm else "hf",
        "grpo.vllm_importance_sampling_correction": bool(args.use_vllm and args.vllm_importance_sampling_correction),
    }
    max_len = args.vllm_max_model_length or model_max_length
    if max_len:
        out["rollout.max_model_len"] = int(max_len)
    return out


def _precision(args) -> dict[str, Any]:
    if args.use_cpu and torch.cuda.is_available():
        raise _refuse("use_cpu", True, "grpo_fast trains on the GPU there is; hide it (CUDA_VISIBLE_DEVICES='')")
    if args.fp16:
        raise _refuse("fp16", True, HINTS["fp16"])
    return {"run.bf16": bool(args.bf16), "run.progress": not args.disable_tqdm, "run.report_to": _report_to(args)}


def _report_to(args) -> list[str]:
    names = [args.report_to] if isinstance(args.report_to, str) else list(args.report_to or [])
    if "all" in names:
        raise _refuse("report_to", args.report_to, "name the trackers (tensorboard, wandb, trackio, mlflow)")
    return [name for name in names if name != "none"]


def _model(args) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kwargs = _dict(args.model_init_kwargs)
    dtype = kwargs.pop("dtype", kwargs.pop("torch_dtype", None))
    if dtype is not None:
        out["model.dtype"] = str(dtype).removeprefix("torch.")
    if "attn_implementation" in kwargs:
        out["model.attn_implementation"] = kwargs.pop("attn_implementation")
    for key, default in (("revision", "main"), ("trust_remote_code", False)):
        if kwargs.get(key, default) in (default, None):
            kwargs.pop(key, None)
    if kwargs:
        raise _refuse("model_init_kwargs", args.model_init_kwargs, f"only dtype and attn_implementation, not {kwargs}")
    checkpointing = args.gradient_checkpointing_kwargs
    if checkpointing not in (None, {}, {"use_reentrant": False}):
        raise _refuse("gradient_checkpointing_kwargs", checkpointing, "grpo_fast checkpoints with use_reentrant=False")
    return out


def _optimizer_steps(args, num_rows: int | None, prompts_per_step: int) -> int:
    """The run's optimizer steps as TRL counts them: max_steps, or num_train_epochs over the generation batches of
    the dataset (TRL's sampler drops an incomplete last one), num_iterations steps each. grpo_fast trains every
    batch num_iterations times, so it must be a multiple of num_iterations (ValueError naming the field)."""
    iterations = args.num_iterations
    if args.max_steps > 0:
        name, value, updates = "max_steps", args.max_steps, int(args.max_steps)
    elif not num_rows:
        raise _refuse("max_steps", args.max_steps, "without a train_dataset to count epochs over, set max_steps")
    elif num_rows < prompts_per_step:
        raise _refuse(
            "max_steps",
            args.max_steps,
            f"the train_dataset's {num_rows} rows make no whole generation batch of {prompts_per_step} prompts "
            "(TRL would train no step): set max_steps, or lower generation_batch_size",
        )
    else:
        name, value = "num_train_epochs", args.num_train_epochs
        updates = math.ceil(args.num_train_epochs * (num_rows // prompts_per_step) * iterations)
    if updates % iterations:
        raise _refuse(
            name,
            value,
            f"{updates} optimizer steps end inside a generation batch (num_iterations={iterations} steps each); "
            f"grpo_fast trains whole batches: make them a multiple of {iterations}",
        )
    return updates


def _text(value: Any) -> str:
    """transformers' enum options (IntervalStrategy, SchedulerType, OptimizerNames) as their text."""
    return str(getattr(value, "value", value))


def _steps(value: float, updates: int) -> int:
    """An optimizer-step count of transformers' convention: a fraction < 1 is a share of the run's `updates`."""
    return max(1, math.ceil(value * updates)) if 0 < value < 1 else int(value)


def _batches(value: float, args, updates: int) -> int:
    """A cadence in optimizer steps (`_steps`) as generation batches, num_iterations steps each (rounded up)."""
    return math.ceil(_steps(value, updates) / args.num_iterations)


def _schedule(args, updates: int) -> dict[str, Any]:
    kind = _text(args.lr_scheduler_type)
    schedules = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
    if kind not in schedules:
        raise _refuse("lr_scheduler_type", kind, f"one of {sorted(schedules)}")
    if args.lr_scheduler_kwargs:
        raise _refuse("lr_scheduler_kwargs", args.lr_scheduler_kwargs, "the schedules take no options here")
    optim = _text(args.optim)
    if optim not in ("adamw_torch", "adamw_torch_fused"):
        raise _refuse("optim", optim, "grpo_fast trains with AdamW (adamw_torch, adamw_torch_fused)")
    warmup = 0 if kind == "constant" else _steps(args.warmup_steps, updates) if args.warmup_steps else 0
    return {"optim.lr_scheduler": schedules[kind], "optim.warmup_steps": warmup}


def _logging(args, updates: int) -> dict[str, Any]:
    strategy = {name: _text(getattr(args, name)) for name in ("logging_strategy", "save_strategy", "eval_strategy")}
    if strategy["logging_strategy"] != "steps":
        raise _refuse("logging_strategy", strategy["logging_strategy"], "grpo_fast logs every run.log_every steps")
    out = {"run.log_every": _batches(args.logging_steps, args, updates)}
    if strategy["save_strategy"] not in ("steps", "no"):
        raise _refuse("save_strategy", strategy["save_strategy"], "steps or no")
    saving = strategy["save_strategy"] == "steps"
    out.update({"run.save_every": _batches(args.save_steps, args, updates) if saving else 0, "run.save_final": saving})
    if strategy["eval_strategy"] not in ("steps", "no"):
        raise _refuse("eval_strategy", strategy["eval_strategy"], "steps or no")
    every = args.eval_steps or args.logging_steps
    out["run.eval_every"] = _batches(every, args, updates) if strategy["eval_strategy"] == "steps" else 0
    return out


def markdown_table(config_class: type) -> str:
    """The table of every field of TRL's `config_class` (GRPOConfig): what grpo_fast makes of it."""
    rows = ["| GRPOConfig field | TRL default | grpo_fast |", "|---|---|---|"]
    for field in sorted(dataclasses.fields(config_class), key=lambda f: f.name):
        name = field.name
        if name in MAPPED:
            what = f"`{MAPPED[name][0]}`"
        elif name in DERIVED:
            what = DERIVED[name]
        elif name in INERT:
            what = f"any value, no effect: {INERT[name]}"
        else:
            what = "refused unless TRL's default" + (f"; {HINTS[name]}" if name in HINTS else "")
        default = repr(trl_field_default(field)).replace("|", "\\|")
        rows.append(f"| `{name}` | `{default}` | {what.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


UNSUPPORTED_ARGUMENTS = {
    "reward_processing_classes": "reward models are reward specs of their own here (grpo_fast.rewards)",
    "optimizers": "grpo_fast builds AdamW and its schedule from the config (learning_rate, lr_scheduler_type, ...)",
    "quantization_config": "load the quantized model yourself and pass the object",
    "peft_config": "wrap the model yourself (peft.get_peft_model(model, peft_config)) and pass it",
}
"""TRL GRPOTrainer arguments grpo_fast refuses when given, with what to do instead."""


def trainer_arguments(model, config, args, tokenizer, processing_class, num_rows: int | None, **unsupported):
    """(TrainConfig, tokenizer or None, reward weights or None) of GRPOTrainer's arguments, grpo_fast's (config,
    tokenizer) or TRL's (args: a GRPOConfig or a TrainConfig; processing_class); ValueError naming an argument
    given twice or one of UNSUPPORTED_ARGUMENTS given at all."""
    for name, value in unsupported.items():
        if value is not None and value != (None, None):
            raise ValueError(f"{name}: not supported by grpo_fast's GRPOTrainer; {UNSUPPORTED_ARGUMENTS[name]}")
    if tokenizer is not None and processing_class is not None:
        raise ValueError("tokenizer / processing_class: the same argument under two names; pass one")
    tokenizer = processing_class if tokenizer is None else tokenizer
    if tokenizer is not None and not callable(getattr(tokenizer, "apply_chat_template", None)):
        raise ValueError(f"processing_class: expected a tokenizer, got {type(tokenizer).__name__}")
    if getattr(tokenizer, "image_processor", None) is not None:
        raise ValueError("processing_class: a multimodal processor; grpo_fast trains text models: pass its tokenizer")
    if config is not None and args is not None:
        raise ValueError("config / args: the run's configuration under two names; pass one")
    args = config if args is None else args
    if args is None or isinstance(args, TrainConfig):
        return args or TrainConfig(), tokenizer, None
    if not (dataclasses.is_dataclass(args) and hasattr(args, "generation_batch_size")):
        raise TypeError(f"args: expected TRL's GRPOConfig or a grpo_fast TrainConfig, got {type(args).__name__}")
    config, weights = trl_config(args, num_rows=num_rows, model_max_length=_max_positions(model))
    return config, tokenizer, weights


def _max_positions(model) -> int | None:
    """The model's max_position_embeddings (of its config, or of the config.json of its path)."""
    if isinstance(model, str):
        from transformers import AutoConfig

        try:
            model_config = AutoConfig.from_pretrained(model)
        except (OSError, ValueError):  # the trainer names a bad path when it loads the model
            return None
    else:
        model_config = getattr(model, "config", None)
    return getattr(model_config, "max_position_embeddings", None)

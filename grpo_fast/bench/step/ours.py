"""grpo_fast's contenders: warm-up and timed steps of our GRPOTrainer, with its defaults or one choice forced
(configs.GRPO_FAST_VARIANTS)."""

from __future__ import annotations

import functools
import json
import math
import time

import torch

from grpo_fast.bench.step.configs import GRPO_FAST_VARIANTS, StepConfig
from grpo_fast.bench.step.policy import dataset_rows
from grpo_fast.bench.step.reward import REWARD_SPEC, reset_seen, seen_stats
from grpo_fast.core.optim import OptimConfig
from grpo_fast.core.packed_attention import implementation
from grpo_fast.core.policy import ModelConfig
from grpo_fast.loss import GRPOLossConfig
from grpo_fast.rollout.registry import resolve_engine_name
from grpo_fast.rollout.vllm_engine import VLLMEngine, VLLMOptions
from grpo_fast.trainer.config import (
    AlgorithmConfig,
    DataConfig,
    HealthConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
)
from grpo_fast.trainer.trainer import GRPOTrainer

MIN_TOKENS_ENGINE = "grpo_fast.bench.step.ours:MinTokensVLLMEngine"


class _SamplingParamsWithMinTokens:
    """The `vllm` module as VLLMEngine uses it, with min_tokens added to every SamplingParams."""

    def __init__(self, module, min_tokens: int) -> None:
        self._module = module
        self.SamplingParams = functools.partial(module.SamplingParams, min_tokens=min_tokens)

    def __getattr__(self, name):
        return getattr(self._module, name)


class MinTokensVLLMEngine(VLLMEngine):
    """grpo_fast's VLLMEngine with vLLM's min_tokens set on every request (class attribute `min_tokens`, set by
    the benchmark): the benchmark's equal minimum completion length. Everything else is VLLMEngine's own code."""

    min_tokens = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not hasattr(self, "_vllm"):
            raise RuntimeError("VLLMEngine no longer keeps the vllm module as _vllm: update the benchmark")
        self._vllm = _SamplingParamsWithMinTokens(self._vllm, self.min_tokens)


def grpo_fast_config(cfg: StepConfig, contender: str, model_dir: str, output_dir: str, max_steps: int, kv_bytes: int):
    """Our TrainConfig for the step of `contender` (a key of GRPO_FAST_VARIANTS): the defaults, but for the shape of
    the step, the sampling settings both trainers share, the engine's minimum length, and the variant's overrides."""
    engine, run_overrides = GRPO_FAST_VARIANTS[contender]
    config = TrainConfig(
        model=ModelConfig(path=model_dir, dtype="float32"),
        data=DataConfig(use_chat_template=False),
        reward=RewardConfig(funcs=[REWARD_SPEC]),
        rollout=RolloutConfig(
            engine=engine,
            num_generations=cfg.num_generations,
            max_completion_length=cfg.max_completion_length,
            temperature=1.0,
            top_p=1.0,
            top_k=-1,
            max_model_len=cfg.max_model_len,
            vllm=VLLMOptions(dtype="float32", kv_cache_memory_bytes=kv_bytes),
        ),
        loss=GRPOLossConfig(loss_type=cfg.loss_type, epsilon_low=0.2, epsilon_high=0.28, beta=0.0),
        grpo=AlgorithmConfig(scale_rewards="group", num_iterations=1),
        optim=OptimConfig(lr=cfg.lr, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0, max_grad_norm=1.0),
        run=RunConfig(
            output_dir=output_dir,
            max_steps=max_steps,
            prompts_per_step=cfg.prompts_per_step,
            micro_batch_size=cfg.micro_batch_size,
            seed=cfg.seed,
            eval_every=0,
            save_final=False,
            report_to=[],
            progress=False,
            plots=False,
        ),
        health=HealthConfig(audit_every=0),
    )
    for key, value in run_overrides.items():
        setattr(config.run, key, value)
    return config


def with_min_tokens(config: TrainConfig, cfg: StepConfig, model) -> None:
    """Makes vLLM (named, or chosen by "auto" for `model`) generate at least cfg.min_completion_length tokens,
    through MinTokensVLLMEngine; the transformers engine gets it through the policy's generation config (set by
    the caller)."""
    if cfg.min_completion_length and resolve_engine_name(config.rollout.engine, model) == "vllm":
        MinTokensVLLMEngine.min_tokens = cfg.min_completion_length
        config.rollout.engine = MIN_TOKENS_ENGINE


class StepRecorder:
    """Wraps a trainer's `training_step` (and its old-logprob pass) to record each step's wall time split into
    the phases of trainer/metrics.py: time/generate, time/score (on the critical path), time/train (the loss
    step, with any old-logprob pass: taken out here), time/sync; the rest of the step is "other"."""

    def __init__(self, trainer: GRPOTrainer) -> None:
        self.records: list[dict] = []
        self.current: dict = {}
        self.loss_step = trainer.loss_step
        self.logprob_pass = getattr(trainer.loss_step, "logprobs", None)  # the old-policy (and reference) pass
        if self.logprob_pass is not None:
            trainer.loss_step.logprobs = self.timed_logprobs
        self.step_fn = trainer.training_step
        trainer.training_step = self.timed_step
        trainer.callbacks.append(self.count_trained)

    def timed_logprobs(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.logprob_pass(*args, **kwargs)
        finally:
            self.current["old_logprobs"] = self.current.get("old_logprobs", 0.0) + time.perf_counter() - start

    def count_trained(self, _trainer, rollout, _metrics) -> None:
        self.current["sequences_trained"] = len(rollout.completions)

    def timed_step(self):
        self.current.clear()
        reset_seen()
        start = time.perf_counter()
        out = self.step_fn()
        wall = time.perf_counter() - start
        phases = {p: float(out.get(f"time/{p}", 0.0) or 0.0) for p in ("generate", "score", "train", "sync")}
        phases["old_logprobs"] = self.current.get("old_logprobs", 0.0)
        phases["train"] -= phases["old_logprobs"]
        phases["other"] = wall - sum(phases.values())
        accounted = {"time/step", "time/score_pool", *(f"time/{p}" for p in phases)}  # time/score_pool: overlapped
        self.records.append(
            {
                "step_s": wall,
                "phases_s": phases,
                "other_timers_s": {k: v for k, v in out.items() if k.startswith("time/") and k not in accounted},
                "trainer_time_step_s": float(out.get("time/step", math.nan)),
                **seen_stats(),
                "sequences_trained": self.current.get("sequences_trained"),
                "train_tokens": float(out.get("train_tokens", math.nan)),
                "layout": f"{implementation(self.loss_step.model)}, {self.loss_step.layout}",
                "metrics": {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and "/" in k},
            }
        )
        return out


def run_grpo_fast(job: dict) -> dict:
    """Warm-up + timed steps of grpo_fast's GRPOTrainer in this process."""
    cfg = StepConfig.from_dict(job["config"])
    steps, kv_bytes = job["warmup"] + job["steps"], job["kv_cache_memory_bytes"]
    config = grpo_fast_config(cfg, job["contender"], job["model_dir"], job["output_dir"], steps, kv_bytes)
    t0 = time.perf_counter()
    trainer = GRPOTrainer(job["model_dir"], [REWARD_SPEC], dataset_rows(cfg), config=config)
    with_min_tokens(config, cfg, trainer.model)  # before the engine exists: "auto" sized on the loaded policy
    if cfg.min_completion_length:  # the transformers engine generates with the trainer's model
        trainer.model.generation_config.min_new_tokens = cfg.min_completion_length
    trainer._ensure_engine()  # built here so that its start-up is reported apart from the steps
    setup_seconds = time.perf_counter() - t0
    recorder = StepRecorder(trainer)
    trainer.train()
    engine_obj = trainer.engine
    result = {
        "engine": getattr(engine_obj, "name", config.rollout.engine),
        "engine_class": f"{type(engine_obj).__module__}.{type(engine_obj).__qualname__}",
        "engine_startup_s": float(getattr(engine_obj, "startup_seconds", 0.0)),
        "setup_s": setup_seconds,
        "settings": json.loads(json.dumps(config.to_dict(), default=str)),
        "old_logprob_pass": "timed around LossStep.logprobs (phases_s.old_logprobs)"
        if recorder.logprob_pass is not None
        else "not measured (LossStep.logprobs not found): inside phases_s.train",
        "records": recorder.records,
    }
    trainer.close()
    result["torch_threads"] = torch.get_num_threads()
    return result

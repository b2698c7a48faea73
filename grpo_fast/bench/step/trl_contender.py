"""TRL's contender: warm-up and timed optimizer steps of trl.GRPOTrainer (use_vllm=False), with timers around its
phases; TRL's behaviour is unchanged."""

from __future__ import annotations

import json
import math
import time

import torch
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, TrainerCallback

from grpo_fast.bench.step.configs import StepConfig
from grpo_fast.bench.step.policy import dataset_rows
from grpo_fast.bench.step.reward import counting_reward, reset_seen, seen_stats
from grpo_fast.data.tokenizer import load_tokenizer


def trl_args(cfg: StepConfig, output_dir: str, max_steps: int):
    """GRPOConfig for the step (the field names of TRL 1.16's trl/trainer/grpo_config.py)."""
    per_step = cfg.completions_per_step
    if per_step % cfg.micro_batch_size:
        raise ValueError(
            f"{cfg.name}: {per_step} completions per step do not split into micro-batches of {cfg.micro_batch_size}"
        )
    generation_kwargs = {"min_new_tokens": cfg.min_completion_length} if cfg.min_completion_length else None
    return trl.GRPOConfig(
        output_dir=output_dir,
        use_vllm=False,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,  # GRPOConfig's default is True; grpo_fast keeps activations
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=per_step // cfg.micro_batch_size,
        # steps_per_generation / generation_batch_size left unset: one generation per optimizer step of
        # per_device_train_batch_size x gradient_accumulation_steps completions
        num_generations=cfg.num_generations,
        max_completion_length=cfg.max_completion_length,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        generation_kwargs=generation_kwargs,
        beta=0.0,
        num_iterations=1,
        loss_type=cfg.loss_type,
        epsilon=0.2,
        epsilon_high=0.28,
        scale_rewards="group",
        mask_truncated_completions=False,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.99,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=max_steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=cfg.seed,
    )


class PhaseClock:
    """Seconds per phase of the current optimizer step, and the step records (shared by the trainer subclass
    and the callback below)."""

    def __init__(self) -> None:
        self.current: dict = {}
        self.records: list[dict] = []

    def add(self, phase: str, seconds: float) -> None:
        self.current[phase] = self.current.get(phase, 0.0) + seconds

    def timed(self, phase: str, call):
        start = time.perf_counter()
        try:
            return call()
        finally:
            self.add(phase, time.perf_counter() - start)


CLOCK = PhaseClock()


class TimedGRPOTrainer(trl.GRPOTrainer):
    """trl.GRPOTrainer with timers around its phases (behaviour unchanged)."""

    def _generate_and_score_completions(self, inputs):
        CLOCK.current["in_rollout"] = True
        try:
            return CLOCK.timed("rollout", lambda: super(TimedGRPOTrainer, self)._generate_and_score_completions(inputs))
        finally:
            CLOCK.current["in_rollout"] = False

    def _generate(self, prompts):
        return CLOCK.timed("generate", lambda: super(TimedGRPOTrainer, self)._generate(prompts))

    def _calculate_rewards(self, *args, **kwargs):
        return CLOCK.timed("score", lambda: super(TimedGRPOTrainer, self)._calculate_rewards(*args, **kwargs))

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        finally:
            if CLOCK.current.get("in_rollout"):  # old-policy / reference logprobs, not the training forward
                CLOCK.add("old_logprobs", time.perf_counter() - start)

    def compute_loss(self, model, inputs, *args, **kwargs):
        current = CLOCK.current
        current["sequences_trained"] = current.get("sequences_trained", 0) + int(inputs["completion_ids"].shape[0])
        tokens = int(inputs["prompt_mask"].sum()) + int(inputs["completion_mask"].sum())
        current["train_tokens"] = current.get("train_tokens", 0) + tokens
        return super().compute_loss(model, inputs, *args, **kwargs)


class StepTimer(TrainerCallback):
    """One record per optimizer step: its wall time split into TRL's phases (train = step - rollout)."""

    def on_step_begin(self, args, state, control, **kwargs):
        CLOCK.current.clear()
        reset_seen()
        CLOCK.current["start"] = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        current = CLOCK.current
        wall = time.perf_counter() - current["start"]
        rollout = current.get("rollout", 0.0)
        phases = {p: current.get(p, 0.0) for p in ("generate", "score", "old_logprobs")}
        phases |= {"train": wall - rollout, "sync": 0.0}
        phases["other"] = rollout - phases["generate"] - phases["score"] - phases["old_logprobs"]
        CLOCK.records.append(
            {
                "step_s": wall,
                "phases_s": phases,
                **seen_stats(),
                "sequences_trained": current.get("sequences_trained"),
                "train_tokens": float(current.get("train_tokens", math.nan)),
                "layout": f"{kwargs['model'].config._attn_implementation}, padded",
            }
        )


def run_trl(job: dict) -> dict:
    """Warm-up + timed optimizer steps of trl.GRPOTrainer in this process."""
    cfg = StepConfig.from_dict(job["config"])
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32)
    tokenizer = load_tokenizer(job["model_dir"])
    args = trl_args(cfg, job["output_dir"], job["warmup"] + job["steps"])
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=[counting_reward],
        args=args,
        train_dataset=Dataset.from_list(dataset_rows(cfg)),
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    setup_seconds = time.perf_counter() - t0
    trainer.train()
    return {
        "engine": "transformers.generate",
        "engine_class": "transformers GenerationMixin.generate",
        "engine_startup_s": 0.0,
        "setup_s": setup_seconds,
        "settings": json.loads(json.dumps(args.to_dict(), default=str)),
        "trl_derived": {
            "steps_per_generation": args.steps_per_generation,
            "generation_batch_size": args.generation_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
        },
        "old_logprob_pass": "none when gradient_accumulation_steps % (steps_per_generation x num_iterations) == 0 "
        "without vLLM (measured in phases_s.old_logprobs)",
        "records": CLOCK.records,
        "torch_threads": torch.get_num_threads(),
    }

"""The benchmark's configurations (tiny, large, prompt_heavy) and their --quick shrinkings."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

CONTENDERS = ("grpo_fast_vllm", "grpo_fast_hf", "trl")
PHASES = ("generate", "score", "old_logprobs", "train", "sync", "other")


@dataclass(frozen=True)
class StepConfig:
    """One benchmark configuration: the policy, the prompts and the step's shape.

    model "tiny": the demo's tiny Qwen2 and character tokenizer on modular-arithmetic prompts (exact-match
    reward); "qwen2": a random-init Qwen2 of the given shape with a `vocab`-word tokenizer, prompts of
    `prompt_tokens` random words (length reward). eos_prob: the per-token EOS probability the weights are tuned
    to (None: the model as initialised). Every contender trains on prompts_per_step x num_generations
    completions per optimizer step, in micro-batches of micro_batch_size sequences."""

    name: str
    model: str = "qwen2"
    layers: int = 4
    hidden: int = 512
    intermediate: int = 1408
    heads: int = 8
    kv_heads: int = 2
    vocab: int = 32000
    prompt_tokens: int = 64
    num_prompts: int = 512
    prompts_per_step: int = 4
    num_generations: int = 8
    max_completion_length: int = 256
    min_completion_length: int = 64
    micro_batch_size: int = 8
    eos_prob: float | None = 1 / 128
    loss_type: str = "dapo"
    lr: float = 1e-6
    seed: int = 0

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations

    @property
    def max_model_len(self) -> int:
        prompt = 16 if self.model == "tiny" else self.prompt_tokens
        return 64 * math.ceil((prompt + self.max_completion_length + 8) / 64)


CONFIGS = {
    "tiny": StepConfig(
        "tiny",
        model="tiny",
        num_prompts=800,
        prompts_per_step=16,
        num_generations=8,
        max_completion_length=4,
        min_completion_length=0,
        micro_batch_size=128,
        eos_prob=None,
    ),
    "large": StepConfig("large"),
    "prompt_heavy": StepConfig(
        "prompt_heavy",
        prompt_tokens=512,
        prompts_per_step=2,
        num_generations=8,
        max_completion_length=64,
        min_completion_length=64,
    ),
}
QUICK = {
    "tiny": dict(num_prompts=64, prompts_per_step=4, num_generations=4, micro_batch_size=16),
    "large": dict(
        num_prompts=64,
        prompt_tokens=16,
        prompts_per_step=2,
        num_generations=4,
        max_completion_length=32,
        min_completion_length=8,
        micro_batch_size=4,
    ),
    "prompt_heavy": dict(
        num_prompts=64,
        prompt_tokens=128,
        prompts_per_step=2,
        num_generations=4,
        max_completion_length=16,
        min_completion_length=16,
        micro_batch_size=4,
    ),
}


def step_config(name: str, quick: bool = False) -> StepConfig:
    cfg = CONFIGS[name]
    return dataclasses.replace(cfg, **QUICK[name]) if quick else cfg

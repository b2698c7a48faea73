"""The benchmark's configurations (tiny, prompt_heavy, and the large one at three micro-batch sizes), its contenders
(grpo_fast with its defaults and with one layout forced, TRL) and their --quick shrinkings."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

GRPO_FAST_VARIANTS = {
    "grpo_fast": ("auto", {}),
    "grpo_fast_padded": ("auto", {"packing": False}),
    "grpo_fast_block_mask": ("auto", {"packing": True, "packed_attention": "model"}),
    "grpo_fast_vllm": ("vllm", {}),
    "grpo_fast_hf": ("hf", {}),
}
"""grpo_fast's contenders: (rollout.engine, run-section overrides). grpo_fast: every default (the engine, packing
and its attention path chosen by `auto`); grpo_fast_padded: run.packing false; grpo_fast_block_mask: packed rows
whose attention is the model's own sdpa over the whole row (the layout `auto` chose before it priced layouts);
grpo_fast_vllm / grpo_fast_hf: the engine named."""
CONTENDERS = (*GRPO_FAST_VARIANTS, "trl")
PHASES = ("generate", "score", "old_logprobs", "train", "sync", "other")
SWEEP_CONTENDERS = ("grpo_fast", "grpo_fast_padded", "grpo_fast_block_mask", "trl")


@dataclass(frozen=True)
class StepConfig:
    """One benchmark configuration: the policy, the prompts and the step's shape.

    model "tiny": the demo's tiny Qwen2 and character tokenizer on modular-arithmetic prompts (exact-match
    reward); "qwen2": a random-init Qwen2 of the given shape with a `vocab`-word tokenizer, prompts of
    `prompt_tokens` random words (length reward). eos_prob: the per-token EOS probability the weights are tuned
    to (None: the model as initialised). Every contender trains on prompts_per_step x num_generations
    completions per optimizer step, in micro-batches of micro_batch_size sequences. policy: the name of the model
    directory (configs that differ only in their micro-batches share one); contenders: the default contenders."""

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
    prompts_per_step: int = 8
    num_generations: int = 8
    max_completion_length: int = 128
    min_completion_length: int = 32
    micro_batch_size: int = 64
    eos_prob: float | None = 1 / 64
    loss_type: str = "dapo"
    lr: float = 1e-6
    seed: int = 0
    policy: str = ""
    contenders: tuple[str, ...] = ("grpo_fast", "trl")

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations

    @property
    def max_model_len(self) -> int:
        prompt = 16 if self.model == "tiny" else self.prompt_tokens
        return 64 * math.ceil((prompt + self.max_completion_length + 8) / 64)

    @property
    def policy_name(self) -> str:
        return self.policy or self.name

    @classmethod
    def from_dict(cls, data: dict) -> StepConfig:
        """The config `dataclasses.asdict` wrote (through JSON: the contenders as a list)."""
        return cls(**{**data, "contenders": tuple(data["contenders"])})


def _large(micro_batch_size: int) -> StepConfig:
    """The large configuration: random Qwen2 (4 layers, hidden 512, vocabulary 32k), 8 prompts of 64 tokens x 8
    completions of 32-128 tokens (mean ~82), at `micro_batch_size`, with every layout contender."""
    return StepConfig(
        f"large_mb{micro_batch_size}", micro_batch_size=micro_batch_size, policy="large", contenders=SWEEP_CONTENDERS
    )


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
    "prompt_heavy": StepConfig(
        "prompt_heavy",
        prompt_tokens=512,
        prompts_per_step=2,
        num_generations=8,
        max_completion_length=64,
        min_completion_length=64,
        micro_batch_size=16,
        eos_prob=1 / 128,
    ),
    **{f"large_mb{size}": _large(size) for size in (64, 16, 8)},
}
_QUICK_QWEN2 = dict(num_prompts=64, prompts_per_step=2, num_generations=4, min_completion_length=8, micro_batch_size=4)
QUICK = {
    "tiny": dict(num_prompts=64, prompts_per_step=4, num_generations=4, micro_batch_size=16),
    "prompt_heavy": dict(_QUICK_QWEN2, prompt_tokens=128, max_completion_length=16, min_completion_length=16),
    **{f"large_mb{size}": dict(_QUICK_QWEN2, prompt_tokens=16, max_completion_length=32) for size in (64, 16, 8)},
}


def step_config(name: str, quick: bool = False) -> StepConfig:
    cfg = CONFIGS[name]
    return dataclasses.replace(cfg, **QUICK[name]) if quick else cfg

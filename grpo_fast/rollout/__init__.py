"""Rollout engines: generate G completions per prompt with the sampled tokens' logprobs, and take the
trainer's weights after each optimizer step. `VLLMEngine` (in-process vLLM, colocated) and `HFEngine`
(transformers `generate`) share the `RolloutEngine` interface; `ROLLOUT_ENGINES` names them (and plug-ins)."""

from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec
from grpo_fast.rollout.registry import ROLLOUT_ENGINES, create_engine
from grpo_fast.rollout.weight_sync import iter_weight_buckets, trainer_weights

__all__ = [
    "ROLLOUT_ENGINES",
    "Completion",
    "RolloutEngine",
    "SamplingSpec",
    "create_engine",
    "iter_weight_buckets",
    "trainer_weights",
]

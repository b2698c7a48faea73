"""Rollout engines: generate G completions per prompt with the sampled tokens' logprobs, and take the
trainer's weights after each optimizer step. `VLLMEngine` (in-process vLLM, colocated) and `HFEngine`
(transformers `generate`) share the `RolloutEngine` interface."""

from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec, make_engine
from grpo_fast.rollout.hf_engine import HFEngine
from grpo_fast.rollout.weight_sync import iter_weight_buckets, trainer_weights

__all__ = [
    "Completion",
    "HFEngine",
    "RolloutEngine",
    "SamplingSpec",
    "iter_weight_buckets",
    "make_engine",
    "trainer_weights",
]


def __getattr__(name: str):
    # VLLMEngine imports vllm lazily (heavy import, absent on some machines).
    if name == "VLLMEngine":
        from grpo_fast.rollout.vllm_engine import VLLMEngine

        return VLLMEngine
    raise AttributeError(name)

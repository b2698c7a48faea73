"""The rollout engine interface shared by the vLLM and transformers engines."""

from __future__ import annotations

import abc
import importlib.util
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingSpec:
    """Decoding options of one `generate` call. temperature=0 is greedy (used for held-out evaluation)."""

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass
class Completion:
    """One sampled completion. `token_ids` include the stop/EOS token when generation stopped on it;
    `logprobs[i]` is the sampling logprob of `token_ids[i]` after temperature / top-p processing."""

    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "stop"  # "stop" or "length" (truncated at max_tokens)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


class RolloutEngine(abc.ABC):
    """Generates completions and receives the trainer's weights.

    Lifecycle of one training step on a colocated GPU: `generate` (awake) -> `sleep` (free memory for the
    trainer) -> training -> `load_weights` (wakes the weights, pushes, wakes the KV cache) -> `generate` ...
    """

    name: str = "base"

    @abc.abstractmethod
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingSpec) -> list[list[Completion]]:
        """Returns `sampling.n` completions for each prompt, in prompt order. Request i uses seed
        `sampling.seed + i * sampling.n` (its n samples seed + i*n + j) when a seed is given."""

    @abc.abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
        """Replaces the engine's weights with the trainer's (HF parameter names); returns timing stats."""

    def sleep(self) -> None:
        """Releases accelerator memory between generations (no-op where unsupported)."""
        return None

    def wake_up(self) -> None:
        """Undoes `sleep` without pushing weights (no-op where unsupported)."""
        return None

    def close(self) -> None:
        """Frees the engine."""
        return None


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def make_engine(kind: str, model_path: str, tokenizer=None, model=None, **kwargs) -> RolloutEngine:
    """`kind` in {"vllm", "hf", "auto"}; "auto" is vLLM when importable, else transformers."""
    if kind == "auto":
        kind = "vllm" if vllm_available() else "hf"
    if kind == "vllm":
        from grpo_fast.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, **kwargs)
    if kind == "hf":
        from grpo_fast.rollout.hf_engine import HFEngine

        if model is None:
            raise ValueError("HFEngine needs the trainer's model object (it generates with a copy of it)")
        return HFEngine(model, tokenizer)
    raise ValueError(f"rollout engine: expected 'vllm', 'hf' or 'auto', got {kind!r}")

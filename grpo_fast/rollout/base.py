"""The rollout engine interface shared by the vLLM and transformers engines (and any plug-in engine,
see grpo_fast.rollout.registry)."""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

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
    """Prompt i's completions are drawn with seed + i * n where the engine `seeds_each_request` (then how prompts
    are split over calls and ranks never changes what they sample); else the call's draws start from it."""


@dataclass
class Completion:
    """One sampled completion. `token_ids` include the stop/EOS token when generation stopped on it;
    `logprobs[i]` is the sampling logprob of `token_ids[i]` after temperature / top-p processing."""

    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "stop"  # "stop" or "length" (truncated at max_tokens)
    segments: list[tuple[int, int]] = field(default_factory=list)
    """(first token index, weight version) of each stretch sampled by one set of weights, in order; the trainer
    sets it (partial rollouts continue a completion over several versions); empty: not recorded."""
    sampled: list[bool] = field(default_factory=list)
    """Multi-turn completions: whether token i was sampled by the engine (False: inserted, a tool's result or the
    chat template's tokens around it, in the sequence but masked out of the loss and of every token-level metric;
    its logprob is 0.0); empty: every token was sampled."""
    episode: ToolEpisode | None = None
    """Multi-turn completions: the conversation and what its tool calls did (grpo_fast.rollout.multi_turn)."""

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def num_sampled(self) -> int:
        """Tokens the engine sampled (the completion's length for every length metric)."""
        return sum(self.sampled) if self.sampled else len(self.token_ids)


@dataclass
class ToolEpisode:
    """One multi-turn rollout: `messages`, its assistant and tool turns as chat messages (what rewards see); its
    tool `calls`, `failures` per tool name (a malformed call, an unknown tool, a tool that raised or timed out),
    assistant `turns`, `tool_seconds` spent in its tools, and `environment_reward` (its environment's
    get_reward(), None without one)."""

    messages: list[dict] = field(default_factory=list)
    calls: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    turns: int = 0
    tool_seconds: float = 0.0
    environment_reward: float | None = None
    environment_discarded: bool = False
    """Whether its environment was discarded (a method timed out): its reward is then the lowest of the rollouts
    handed out with it (grpo_fast.rollout.environments)."""
    environment: object = None
    """The rollout's environment instance (TRL passes them to reward functions as `environments`)."""

    @property
    def answer(self) -> str:
        """The content of its last assistant turn: the completion's text, which rewards score."""
        last = next((m for m in reversed(self.messages) if m["role"] == "assistant"), None)
        return last.get("content", "") if last else ""


@dataclass(frozen=True)
class EngineSelection:
    """Which engine a run uses and why: `requested` is rollout.engine as written ("auto", a name, a path)."""

    requested: str
    name: str
    reason: str


class RolloutEngine(abc.ABC):
    """Generates completions and receives the trainer's weights.

    Lifecycle of one training step on a colocated GPU: `generate` (awake) -> `sleep` (free memory for the
    trainer) -> training -> `load_weights` (wakes the weights, pushes, wakes the KV cache) -> `generate` ...

    An engine is built by the trainer through `from_config`, so the trainer never needs to know an
    engine's own options: they are its `options` section (a grpo_fast.config_fields.ConfigSection dataclass):
    `rollout.<name>` for the built-ins, `rollout.plugins.<name>` for a plug-in, where <name> is how
    rollout.engine names it.
    """

    name: str = "base"
    options: ClassVar[type | None] = None
    """The engine's config section class (None: it has no options of its own)."""
    selection: EngineSelection | None = None
    """Set by `grpo_fast.rollout.registry.create_engine`: which engine rollout.engine resolved to and why."""
    shares_trainer_model: bool = False
    """True when the engine generates with the trainer's own model object: its parameters must then stay
    resident on the device during generation (the trainer does not offload them)."""

    @classmethod
    def available(cls) -> bool:
        """Whether this engine can run here (its libraries import); "auto" picks the first available."""
        return True

    seeds_each_request: ClassVar[bool] = True
    """Whether prompt i of a call samples from its own seed (`SamplingSpec.seed`), as vLLM does; False (the
    transformers engine): one seed starts the call, so a prompt's samples depend on the call it is in, and
    reward.overlap_chunks auto then keeps one call a round (its samples would otherwise follow the timing)."""
    lockstep: bool = False
    """Whether `generate` is a collective of several ranks (a vLLM engine spanning them with tensor
    parallelism): every one of them then calls it equally often, with its own prompts (possibly none)."""
    runs_in_engine_process: ClassVar[bool] = True
    """Whether it can be built in an engine process of its own (rollout.mode async, grpo_fast.rollout.contract): there
    `from_config` gets that process's tokenizer and, when `shares_trainer_model`, its own model, both loaded from the
    model directory that export_model() returns, and `config` holds the rollout section and run.seed as plain data
    with attribute access. An engine that needs the trainer's objects sets it False."""

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config, *, options: Any, model, tokenizer, export_model: Callable[[], str]) -> RolloutEngine:
        """Build the engine for a run. config: the TrainConfig (rollout / run sections); options: the engine's own
        section (an instance of `options`, or None); model, tokenizer: the trainer's; export_model(): writes the
        policy's current weights as a Hugging Face directory and returns its path (call it only if the engine
        loads the model from disk)."""

    @abc.abstractmethod
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingSpec) -> list[list[Completion]]:
        """Returns `sampling.n` completions for each prompt, in prompt order. Request i uses seed
        `sampling.seed + i * sampling.n` (its n samples seed + i*n + j) when a seed is given."""

    @abc.abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
        """Replaces the engine's weights with the trainer's (HF parameter names); returns timing stats. An engine
        that copies the weights checks that the sync named each of its parameters exactly once and raises
        otherwise (`grpo_fast.rollout.weight_check`): a partial sync would leave it generating from stale weights."""

    def sleep(self) -> None:
        """Releases accelerator memory between generations (no-op where unsupported)."""
        return None

    def wake_up(self) -> None:
        """Undoes `sleep` without pushing weights (no-op where unsupported)."""
        return None

    def close(self) -> None:
        """Frees the engine."""
        return None

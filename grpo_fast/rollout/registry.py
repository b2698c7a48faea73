"""Rollout engines by name: "vllm" (in-process vLLM) and "hf" (transformers `generate`), plus plug-ins.

A plug-in engine is a `RolloutEngine` subclass with a `from_config` classmethod; register it with
`ROLLOUT_ENGINES.register("name", MyEngine)` or name it in the config as "package.module:MyEngine".
"""

from __future__ import annotations

from collections.abc import Callable

from grpo_fast.registry import Registry
from grpo_fast.rollout.base import RolloutEngine

ROLLOUT_ENGINES = Registry(
    "rollout engine",
    {"vllm": "grpo_fast.rollout.vllm_engine:VLLMEngine", "hf": "grpo_fast.rollout.hf_engine:HFEngine"},
)
AUTO_ORDER = ("vllm", "hf")
"""What "auto" tries, in order: the first engine whose `available()` is true."""


def resolve_engine_name(name: str) -> str:
    """`name`, or for "auto" the first available engine of AUTO_ORDER."""
    if name != "auto":
        return name
    for candidate in AUTO_ORDER:
        if ROLLOUT_ENGINES.get(candidate).available():
            return candidate
    raise RuntimeError(f"rollout engine 'auto': none of {AUTO_ORDER} is available")


def create_engine(name: str, config, *, model, tokenizer, export_model: Callable[[], str]) -> RolloutEngine:
    """Build the engine `name` ("auto", a registered name or "package.module:Class") for a training run."""
    engine_cls = ROLLOUT_ENGINES.get(resolve_engine_name(name))
    if not (isinstance(engine_cls, type) and issubclass(engine_cls, RolloutEngine)):
        raise ValueError(f"rollout engine {name!r}: expected a RolloutEngine subclass, got {engine_cls!r}")
    return engine_cls.from_config(config, model=model, tokenizer=tokenizer, export_model=export_model)

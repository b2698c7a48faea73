"""Rollout engines by name: "vllm" (in-process vLLM) and "hf" (transformers `generate`), plus plug-ins.

A plug-in engine is a `RolloutEngine` subclass with a `from_config` classmethod; register it with
`ROLLOUT_ENGINES.register("name", MyEngine)` or name it in the config as "package.module:MyEngine". Either way it is
checked there (`check_engine`): a class with an abstract method left (no `load_weights` ...) is refused, naming it.

"auto" picks what is faster for the model and the hardware (`choose_engine`): vLLM on a GPU and for
models of AUTO_HF_MAX_PARAMS_CPU parameters and more on CPU; transformers below that on CPU, where vLLM's
fixed cost per step (scheduling, request and output bookkeeping in Python) outweighs its faster kernels
(benchmarks/bench_engines.py, benchmarks/results/engines_cpu.json); transformers wherever vLLM is not
installed. The engine built by `create_engine` carries the choice (`engine.selection`), and it is logged.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from grpo_fast.config_fields import build
from grpo_fast.registry import Registry, refuse_missing
from grpo_fast.rollout.base import EngineSelection, RolloutEngine

logger = logging.getLogger(__name__)


def check_engine(name: str, engine_cls: Any) -> type[RolloutEngine]:
    """`engine_cls` if it is a RolloutEngine subclass with every abstract method implemented; TypeError naming what
    is missing otherwise."""
    if not (isinstance(engine_cls, type) and issubclass(engine_cls, RolloutEngine)):
        raise TypeError(f"rollout engine {name!r}: expected a RolloutEngine subclass, got {engine_cls!r}")
    missing = sorted(engine_cls.__abstractmethods__)
    refuse_missing("rollout engine", name, missing, "grpo_fast.rollout.base.RolloutEngine")
    return engine_cls


ROLLOUT_ENGINES = Registry(
    "rollout engine",
    {"vllm": "grpo_fast.rollout.vllm_engine:VLLMEngine", "hf": "grpo_fast.rollout.hf_engine:HFEngine"},
    contract=check_engine,
)
AUTO_ORDER = ("vllm", "hf")
"""What "auto" may pick, in order of preference where the model's size does not decide (no model given)."""

AUTO_HF_MAX_PARAMS_CPU = 5_000_000
"""On CPU, "auto" generates with transformers below this many parameters (the policy's, embeddings
included) and with vLLM from there on. Measured with one thread (benchmarks/results/engines_cpu.json): up to
2.5M parameters transformers is faster on every shape (about 2x at the demo's 0.3M, 1.1-1.6x at 2.5M);
from 7M on vLLM is faster on training-step shapes (1.1-1.6x at 7M and 45M), while short greedy evaluation
stays slightly faster with transformers (0.8x at 7M, 1.0x at 45M)."""


def choose_engine(name: str, model=None) -> EngineSelection:
    """The engine for rollout.engine `name`: itself unless "auto"; for "auto", see the module docstring.
    model: the trainer's policy (sized by its parameters, located by their device); None: not sized, the
    first available engine of AUTO_ORDER (an engine that loads its own model, as the sampler's vLLM)."""
    if name != "auto":
        return EngineSelection(name, name, "named in rollout.engine")
    available = [c for c in AUTO_ORDER if ROLLOUT_ENGINES.get(c).available()]
    if not available:
        raise RuntimeError(f"rollout engine 'auto': none of {AUTO_ORDER} is available")
    if "vllm" not in available:
        return EngineSelection(name, available[0], "vLLM is not installed")
    if model is None:
        return EngineSelection(name, "vllm", "vLLM is installed (no model given to size)")
    import torch

    first = next(iter(model.parameters()), None)
    device = first.device if first is not None else torch.device("cpu")
    if device.type != "cpu" or torch.cuda.is_available():
        where = device.type if device.type != "cpu" else "cuda"
        return EngineSelection(name, "vllm", f"on an accelerator ({where}) vLLM is the faster engine")
    params = sum(p.numel() for p in model.parameters())
    size = f"{params / 1e6:.2f}M parameters on CPU"
    limit = f"{AUTO_HF_MAX_PARAMS_CPU / 1e6:g}M"
    if params < AUTO_HF_MAX_PARAMS_CPU:
        return EngineSelection(
            name,
            "hf",
            f"{size}, below {limit}: transformers generate is faster than vLLM's per-step overhead at this size "
            "(benchmarks/results/engines_cpu.json); set rollout.engine=vllm to use vLLM anyway",
        )
    return EngineSelection(name, "vllm", f"{size}, at least {limit}: vLLM is faster at this size")


def resolve_engine_name(name: str, model=None) -> str:
    """`name`, or the engine "auto" picks (for `model` when given: see `choose_engine`)."""
    return choose_engine(name, model).name


def create_engine(name: str, config, *, model, tokenizer, export_model: Callable[[], str]) -> RolloutEngine:
    """Build the engine `name` ("auto", a registered name or "package.module:Class") for a training run.
    The engine's `selection` (an EngineSelection) says which engine "auto" picked and why; it is logged."""
    selection = choose_engine(name, model)
    engine_cls = ROLLOUT_ENGINES.get(selection.name)  # checked against the contract (check_engine) when loaded
    if not engine_cls.available():
        raise RuntimeError(
            f"rollout.engine: {selection.name!r} is not available here (its library, {selection.name}, is not "
            "installed or does not import); install it, or set rollout.engine: hf (transformers generate) or auto"
        )
    if name == "auto":
        logger.info("rollout engine 'auto' -> %s: %s", selection.name, selection.reason)
    options = engine_options(config.rollout, selection.name, engine_cls)
    engine = engine_cls.from_config(
        config, options=options, model=model, tokenizer=tokenizer, export_model=export_model
    )
    engine.selection = selection
    return engine


def engine_options(rollout, name: str, engine_cls: type[RolloutEngine]) -> Any:
    """The options section of engine `name`: `rollout.plugins[name]` checked against the engine's `options` class
    when given; else the rollout section of that class (`rollout.vllm` for the vLLM engine and its subclasses,
    `rollout.hf` ...); else the class's defaults. None for an engine without options."""
    if engine_cls.options is None:
        if rollout.plugins.get(name):
            raise ValueError(f"rollout.plugins.{name}: the engine {name!r} takes no options")
        return None
    if name in rollout.plugins:
        return build(engine_cls.options, dict(rollout.plugins[name] or {}), f"rollout.plugins.{name}")
    sections = (getattr(rollout, f.name) for f in dataclasses.fields(rollout))
    return next((s for s in sections if type(s) is engine_cls.options), None) or engine_cls.options()

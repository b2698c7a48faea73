"""The GRPO training loop: the config tree, the rollout phase, the loss step, advantages, checkpoints, offload,
health alarms and the run report. The names load on first use (importing a submodule, e.g. the config, does
not build the whole trainer)."""

import importlib

_EXPORTS = {"GRPOTrainer": "trainer", "TrainConfig": "config", "load_config": "config"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'grpo_fast.trainer' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))

"""The GRPO training loop: the config tree, the rollout phase, the loss step, advantages, checkpoints, offload,
health alarms and the run report. The names load on first use (importing a submodule, e.g. the config, does
not build the whole trainer)."""

from grpo_fast.registry import lazy_exports

_EXPORTS = {"GRPOTrainer": "trainer", "TrainConfig": "config", "load_config": "config"}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

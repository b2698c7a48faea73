"""The online pass-rate curriculum: train only on prompts the policy solves sometimes.

Before step 0 and every `curriculum.every` steps, `curriculum.samples` completions of the training
prompts (all, or `max_prompts` drawn at random) are sampled at the run's settings and scored; prompts
whose pass rate leaves [low, high] are dropped from the prompt order, prompts that come back into the
band return. Prompts never measured stay in. The pass rates are kept in checkpoints.
"""

from __future__ import annotations

import logging
import random
import time

from grpo_fast.curate.pass_rates import in_band, sample_prompts
from grpo_fast.rewards.columns import TrainerState
from grpo_fast.rollout.prompts import training_sampling

logger = logging.getLogger(__name__)


class PassRateCurriculum:
    def __init__(self, config, num_rows: int, seed: int) -> None:
        self.config, self.num_rows, self.seed = config, num_rows, seed
        self.pass_rates: dict[int, float] = {}

    def due(self, step: int) -> bool:
        return self.config.every > 0 and step % self.config.every == 0

    def update(self, trainer, step: int) -> dict[str, float]:
        """Measures pass rates with the trainer's (awake) engine and restricts its prompt sampler to the
        band; returns the curriculum/... metrics."""
        cfg, t0 = self.config, time.perf_counter()
        index = list(range(self.num_rows))
        if cfg.max_prompts and cfg.max_prompts < self.num_rows:
            index = sorted(random.Random(self.seed * 7919 + step).sample(index, cfg.max_prompts))
        seed = (self.seed * 1_000_003 + step * 10_007) * 1000 + 999  # apart from the rollout phase's seeds
        spec = training_sampling(trainer.config.rollout, trainer.stop_ids, cfg.samples, seed)
        state = TrainerState(global_step=step, max_steps=trainer.config.run.max_steps)
        for result in sample_prompts(
            trainer.engine, trainer.rollouts, trainer.train_rows, index, trainer.rewards, spec, state
        ):
            self.pass_rates[result.row] = result.pass_rate
        active = [i for i in range(self.num_rows) if in_band(self.pass_rates.get(i, cfg.low), cfg.low, cfg.high)]
        if active:
            trainer.sampler.set_active(active)
        else:
            logger.warning(
                "curriculum: no training prompt has a pass rate in [%g, %g]; keeping the previous prompt set",
                cfg.low,
                cfg.high,
            )
        measured = self.pass_rates.values()
        return {
            "curriculum/active_prompts": float(len(active)),
            "curriculum/mastered_prompts": float(sum(p > cfg.high + 1e-9 for p in measured)),
            "curriculum/unsolved_prompts": float(sum(p < cfg.low - 1e-9 for p in measured)),
            "curriculum/pass_rate_mean": sum(measured) / max(len(measured), 1),
            "time/curriculum": time.perf_counter() - t0,
        }

    def state_dict(self) -> dict:
        return {"pass_rates": dict(self.pass_rates)}

    def load_state_dict(self, state: dict) -> None:
        self.pass_rates = {int(k): float(v) for k, v in state["pass_rates"].items()}

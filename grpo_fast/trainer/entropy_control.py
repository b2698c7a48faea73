"""Adaptive entropy control (Skywork-OR1), TRL 1.16's `use_adaptive_entropy`: a controller that moves the
entropy bonus's coefficient between optimizer steps.

TRL's rule (`GRPOTrainer._compute_loss`): every micro-batch of an optimizer step applies
coef if the previous step's entropy <= entropy_target else 0 (the previous entropy starts at +inf: no bonus
on the first step); at the step's end, with H the token-weighted mean entropy over all the step's
micro-batches, coef <- min(coef + delta, coef_max) if H <= target else max(coef - delta, coef_min).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class AdaptiveEntropy:
    coef: float
    target: float
    delta: float
    coef_min: float
    coef_max: float
    last_entropy: float = math.inf

    def applied_coef(self) -> float:
        """The coefficient every micro-batch of the coming optimizer step applies."""
        return self.coef if self.last_entropy <= self.target else 0.0

    def update(self, entropy_sum: float, tokens: float) -> None:
        """After an optimizer step: Σ H and the count of the tokens it was measured over, whole step."""
        entropy = entropy_sum / max(tokens, 1.0)
        if not math.isfinite(entropy):  # a non-finite step (skipped by the loss step) does not move the controller
            return
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.coef_max)
        else:
            self.coef = max(self.coef - self.delta, self.coef_min)
        self.last_entropy = entropy

    def state_dict(self) -> dict[str, float]:
        return {"entropy_coef": self.coef, "last_world_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef, self.last_entropy = float(state["entropy_coef"]), float(state["last_world_entropy"])

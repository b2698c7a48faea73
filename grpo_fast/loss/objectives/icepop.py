"""IcePop: PPO's clipped objective on the tokens whose train/inference probability ratio stays in [α, β], each
weighted by that ratio; the others give no gradient.

Definition (the Ring-1T team's IcePop, https://ringtech.notion.site/icepop), as AReaL implements it
(areal/utils/functional/functional.py `apply_rejection_sampling` and `ppo_actor_loss_fn` with
`rejection_sampling: {level: token, action: mask, metric: ratio, lower: 0.5, upper: 5.0}`, areal-project/AReaL
cbff54d) and OpenRLHF (openrlhf/models/loss.py `PolicyLoss`, `--algo.advantage.is_correction_type icepop`, default
thresholds 0.5 5.0, OpenRLHF/OpenRLHF 3c3be62):

    k_i = π_train(y_i; θ_old) / π_infer(y_i; θ_old) = exp(o_i − μ_i)      (detached)
    M(k) = k where α ≤ k ≤ β, else 0
    p_i = M(k_i) · (−min(ρ_i A_i, clip(ρ_i, 1 − ε_lo, 1 + ε_hi) A_i))

with o the trainer's old logprobs (the update's own policy when it is on-policy), μ the inference engine's logprobs
of the sampled tokens, ρ = π/π_old and ε, δ the loss's clip options. A dropped token still counts in the reduction's
denominators (AReaL normalises by the mask before rejection).

Needs from the rollout: the inference engine's logprobs (`needs_rollout_logprobs`); without them the loss refuses to
run, naming them. Loss type `icepop`: token mean of the whole batch, as AReaL's and OpenRLHF's token-level loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...config_fields import option
from ..loss_types import LossType, Reduction
from ..objective import ObjectiveOptions, SurrogateInputs
from .trl import engine_masked


@dataclass(frozen=True)
class IcePopOptions(ObjectiveOptions):
    alpha: float = option(0.5, "IcePop's lower bound of π_train / π_infer (tokens below it are dropped)", low=0)
    beta: float = option(5.0, "IcePop's upper bound of π_train / π_infer (tokens above it are dropped)", low=0)

    def validate(self) -> None:
        if not self.alpha < self.beta:
            raise ValueError(f"objective_options.alpha: expected alpha < beta ({self.beta}), got {self.alpha}")


def icepop_kept(x: SurrogateInputs) -> torch.Tensor:
    """The tokens whose k = π_train / π_infer lies in [α, β]."""
    k = torch.exp(x.old_logprobs - x.rollout_logprobs)
    return (k >= x.options.alpha) & (k <= x.options.beta)


ICEPOP = engine_masked(
    "icepop",
    icepop_kept,
    "PPO-clip on the tokens whose pi_train/pi_infer lies in [alpha, beta], weighted by it",
    IcePopOptions,
)
LOSS_TYPE = LossType("icepop", ICEPOP, Reduction.GLOBAL_TOKEN_MEAN, "IcePop: masked train/inference ratio, like dapo")

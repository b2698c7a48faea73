"""KPop: IcePop with a bidirectional binary-KL test instead of the ratio bounds — a token is dropped when the
Bernoulli KL between its train and inference probabilities exceeds φ in either direction.

Definition (https://ringtech.notion.site/kpop), as AReaL implements it (areal/utils/functional/functional.py
`apply_rejection_sampling` with `metric: binary_kl`, `compute_binary_kl_divergence`, and `ppo_actor_loss_fn`;
docs/en/algorithms/grpo_series.md "KPop", examples/math/gsm8k_kpop.yaml `upper: 2.0`; areal-project/AReaL cbff54d):

    p = clamp(π_train(y_i; θ_old), ε, 1 − ε), q = clamp(π_infer(y_i; θ_old), ε, 1 − ε), ε = 1e-8
    KL(p ‖ q) = p log(p / q) + (1 − p) log((1 − p) / (1 − q))
    kept_i = max(KL(p ‖ q), KL(q ‖ p)) ≤ φ
    k_i = exp(o_i − μ_i) (detached);   p_i = [kept_i] · k_i · (−min(ρ_i A_i, clip(ρ_i, 1 − ε_lo, 1 + ε_hi) A_i))

(AReaL multiplies the surviving tokens by the behaviour importance weight k, as for IcePop.) o: the trainer's old
logprobs, μ: the inference engine's.

Needs from the rollout: the inference engine's logprobs (`needs_rollout_logprobs`). Loss type `kpop`: token mean of
the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...config_fields import option
from ..loss_types import LossType, Reduction
from ..objective import ObjectiveOptions, SurrogateInputs
from .trl import engine_masked


@dataclass(frozen=True)
class KPopOptions(ObjectiveOptions):
    threshold: float = option(2.0, "KPop's φ: tokens whose binary KL (either direction) exceeds it are dropped", low=0)


def binary_kl(log_p: torch.Tensor, log_q: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """KL(P ‖ Q) of the Bernoulli distributions [p, 1 − p] and [q, 1 − q] given by log-probabilities (clamped to
    [eps, 1 − eps])."""
    p = torch.clamp(torch.exp(log_p), eps, 1.0 - eps)
    q = torch.clamp(torch.exp(log_q), eps, 1.0 - eps)
    return p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))


def kpop_kept(x: SurrogateInputs) -> torch.Tensor:
    """The tokens whose binary KL between π_train and π_infer, either way, is at most φ."""
    train, engine = x.old_logprobs.detach(), x.rollout_logprobs
    return torch.maximum(binary_kl(train, engine), binary_kl(engine, train)) <= x.options.threshold


KPOP = engine_masked(
    "kpop",
    kpop_kept,
    "PPO-clip on the tokens whose train/inference binary KL (both ways) is at most phi, weighted by pi_train/pi_infer",
    KPopOptions,
)
LOSS_TYPE = LossType("kpop", KPOP, Reduction.GLOBAL_TOKEN_MEAN, "KPop: binary-KL token mask, like dapo")

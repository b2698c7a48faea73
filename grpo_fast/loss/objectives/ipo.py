"""prime-rl's IPO (INTELLECT Policy Optimization): a symmetric trust region against the *inference* policy — a token
whose probability moved more than ε in absolute terms from the engine's is masked — and a policy gradient through
the importance ratio to the engine on the other tokens.

Definition: prime-rl's `ipo_loss_fn` (src/prime_rl/trainer/rl/loss.py, `IPOLossConfig` in
packages/prime-rl-configs/src/prime_rl/configs/trainer.py; PrimeIntellect-ai/prime-rl 559b447, added in 77af037):

    r_i = exp(ℓ_i − μ_i)                     (differentiable: the gradient is −A r ∇ℓ on kept tokens)
    masked_i = |exp(ℓ_i) − exp(μ_i)| > ε
    p_i = −[¬masked_i] · τ_A A_i r_i + τ_KL (ℓ_i − μ_i)²

with ℓ the current logprob and μ the inference engine's. prime-rl's defaults: ε = ipo_threshold = 0.1, τ_A = adv_tau
= 1, τ_KL = kl_tau = 1e-3 (its squared-log-ratio regulariser, on every token). Set kl_tau: 0 for the variant without
the KL term (an earlier prime-rl default loss used ε = 0.2 and kl_tau = 1e-3, commit 02bdca2). The trainer's old
policy plays no part: the ratio and the mask are against the engine. prime-rl sums the per-token loss and normalises
by the batch's token count: loss type `ipo` is the token mean of the whole batch.

Needs from the rollout: the inference engine's logprobs (`needs_rollout_logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...config_fields import option
from ..loss_types import LossType, Reduction
from ..objective import Objective, ObjectiveOptions, Surrogate, SurrogateInputs


@dataclass(frozen=True)
class IPOOptions(ObjectiveOptions):
    threshold: float = option(
        0.1, "IPO's ε: tokens with |π − π_infer| > ε are masked (prime-rl's ipo_threshold)", low=0
    )
    adv_tau: float = option(1.0, "IPO's scale of the advantage term (prime-rl's adv_tau)", low=0)
    kl_tau: float = option(
        1e-3, "IPO's weight of the squared log-ratio to the engine (prime-rl's kl_tau; 0: off)", low=0
    )


def ipo(x: SurrogateInputs) -> Surrogate:
    o = x.options
    log_ratio = x.logprobs - x.rollout_logprobs
    prob_gap = torch.exp(x.logprobs.detach()) - torch.exp(x.rollout_logprobs)
    low, high = prob_gap < -o.threshold, prob_gap > o.threshold
    masked = low | high
    policy = torch.where(masked, torch.zeros_like(log_ratio), o.adv_tau * x.advantages * torch.exp(log_ratio))
    return Surrogate(-policy + o.kl_tau * log_ratio**2, low, high, masked)


IPO = Objective(
    "ipo",
    ipo,
    "prime-rl's IPO: |pi - pi_infer| > eps masked, ratio-to-engine policy gradient, squared log-ratio KL",
    options=IPOOptions,
    needs_rollout_logprobs=True,
    masks_tokens=True,
    levels=("token",),
)
LOSS_TYPE = LossType("ipo", IPO, Reduction.GLOBAL_TOKEN_MEAN, "prime-rl's IPO, normalised by the batch's tokens")

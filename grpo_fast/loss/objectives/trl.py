"""TRL 1.16's per-token objectives, written as `GRPOTrainer._compute_loss` writes them (trl/trainer/grpo_trainer.py),
with the hyper-parameters under TRL's own names (GRPOLossConfig fields). Each has a code in the layer-2 Triton kernel.

Notation: ρ the ratio π/π_old (per token, or one per sequence at importance_sampling_level="sequence"), A the
advantage, ℓ the logprob, o the old logprob, sg the stop-gradient, w the importance weight.
"""

from __future__ import annotations

import math

import torch

from ..objective import Objective, Surrogate, SurrogateInputs


def clipped(x: SurrogateInputs) -> Surrogate:
    """PPO's clipped surrogate −min(ρA, clip(ρ, 1 − ε_lo, 1 + ε_hi)A), the unclipped ρ capped at δ when given
    (INTELLECT-2's two-sided clipping)."""
    c = x.config
    bounded = torch.clamp(x.ratio, 1 - c.epsilon_low, 1 + c.clip_high)
    unclipped = x.ratio if c.delta is None else torch.clamp(x.ratio, max=c.delta)
    low = (x.ratio < 1 - c.epsilon_low) & (x.advantages < 0)
    high = (x.ratio > 1 + c.clip_high) & (x.advantages > 0)
    return Surrogate(-torch.min(unclipped * x.advantages, bounded * x.advantages), low, high)


def engine_masked(name: str, kept, summary: str, options: type) -> Objective:
    """An objective of PPO's clipped surrogate on the tokens whose train/inference mismatch test `kept(x)` -> [N]
    bool passes, each weighted by k = π_train / π_infer = exp(o − μ) (detached); the others masked (IcePop, KPop).
    It needs the inference engine's logprobs μ."""

    def definition(x: SurrogateInputs) -> Surrogate:
        ppo, keep = clipped(x), kept(x)
        k = torch.exp(x.old_logprobs - x.rollout_logprobs).detach()
        return Surrogate(ppo.per_token * torch.where(keep, k, torch.zeros_like(k)), ppo.low, ppo.high, ~keep)

    definition.__name__ = definition.__qualname__ = name
    return Objective(name, definition, summary, options=options, needs_rollout_logprobs=True, masks_tokens=True)


def cispo(x: SurrogateInputs) -> Surrogate:
    """REINFORCE with the detached, capped ratio: −sg(min(ρ, ε_hi)) A ℓ (MiniMax-M1, arXiv 2506.13585)."""
    capped = torch.clamp(x.ratio, max=x.config.clip_high).detach()
    high = (x.ratio > x.config.clip_high) & (x.advantages > 0)
    return Surrogate(-capped * x.advantages * x.logprobs, torch.zeros_like(high), high)


def sapo(x: SurrogateInputs) -> Surrogate:
    """A soft gate instead of the clip: −(4/τ) σ(τ (ρ − 1)) A with τ = sapo_temperature_pos where A > 0,
    sapo_temperature_neg otherwise (SAPO, arXiv 2511.20347); its slope at ρ = 1 is that of ρA. No clip flags."""
    c, adv = x.config, x.advantages
    tau = torch.where(adv > 0, adv.new_tensor(c.sapo_temperature_pos), adv.new_tensor(c.sapo_temperature_neg))
    none = torch.zeros_like(adv, dtype=torch.bool)
    return Surrogate(-torch.sigmoid(tau * (x.ratio - 1)) * 4 / tau * adv, none, none)


def vespo(x: SurrogateInputs) -> Surrogate:
    """REINFORCE scaled by a detached gamma weight of the sequence's ratio: −sg(φ_b) A ℓ (VESPO, arXiv 2602.10693),
    TRL's `GRPOTrainer.get_gamma_weights`:

        φ = exp(λ + k log W − λ W) (0 where it overflows),
        log W_b = clamp(Σ_{i∈b} m_i (clamp(ℓ_i − o_i, −20, 20) + clamp(log w_i, log 1e-8, 20)), log 1e-8, 20)

    — the sum of the token log-ratios whatever importance_sampling_level says; weights given one per sequence enter
    once (clamp(log w_b)), not once per token; (k, λ) = (vespo_k_pos, vespo_lambda_pos) where A ≥ 0, the _neg pair
    otherwise, λ floored at 1e-4. The importance weights are inside φ (weights_inside)."""
    none = torch.zeros_like(x.advantages, dtype=torch.bool)
    return Surrogate(-_gamma_weights(x) * x.advantages * x.logprobs, none, none)


@torch.no_grad()
def _gamma_weights(x: SurrogateInputs) -> torch.Tensor:
    c, adv, mask = x.config, x.advantages, x.mask
    floor = math.log(1e-8)
    log_terms = torch.clamp(x.log_ratio, -20.0, 20.0)
    if x.is_weights is not None:  # log 0 = −inf (TRL's token_mask rejections) clamps to log 1e-8
        log_is = torch.clamp(torch.log(x.is_weights), floor, 20.0)
        log_terms = log_terms + (log_is / x.sequences.length if x.is_weights_per_sequence else log_is)
    log_w = torch.clamp(x.sequences.sum(mask * log_terms), floor, 20.0)
    nonneg = adv >= 0
    k = torch.where(nonneg, adv.new_tensor(c.vespo_k_pos), adv.new_tensor(c.vespo_k_neg))
    lam = torch.where(nonneg, adv.new_tensor(c.vespo_lambda_pos), adv.new_tensor(c.vespo_lambda_neg)).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def _cispo_needs_its_cap(config) -> None:
    if config.epsilon_high is None or config.epsilon_high <= 0:
        raise ValueError(
            f"epsilon_high: loss_type={config.loss_type!r} caps the ratio at epsilon_high (at 0 every token's weight "
            f"is 0); give it a value > 0 (e.g. 5.0), got {config.epsilon_high}"
        )


CLIPPED = Objective("clipped", clipped, "PPO's clipped ratio (optionally capped at delta)", kernel=0)
CISPO = Objective(
    "cispo", cispo, "REINFORCE with the detached ratio capped at epsilon_high", kernel=1, validate=_cispo_needs_its_cap
)
SAPO = Objective("sapo", sapo, "sigmoid gate on the ratio instead of the clip", kernel=2)
VESPO = Objective(
    "vespo",
    vespo,
    "REINFORCE scaled by a gamma weight of the sequence ratio",
    whole_sequences=True,
    weights_inside=True,
    kernel=3,
)

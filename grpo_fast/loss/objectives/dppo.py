"""DPPO (arXiv 2602.04879): a trust region on the change of each token's probability instead of its ratio — binary
total variation (`dppo_tv`) or binary KL (`dppo_kl`) — with a truncated, detached importance ratio on the tokens
inside it.

Definitions: verl's `compute_policy_loss_dppo_tv` / `compute_policy_loss_dppo_kl` (verl/trainer/ppo/core_algos.py,
verl-project/verl 1dda039), with p = π(y_i) and q = π_old(y_i):

    ρ_i = exp(clamp(ℓ_i − o_i, −20, 20)),   p_i = −A_i · sg(min(ρ_i, C)) · ℓ_i · valid_i
    dppo_tv: valid_i = (p − q ≤ δ_hi) where A_i > 0, (p − q ≥ −δ_lo) otherwise
    dppo_kl: KL_i = q (o_i − ℓ_i) + (1 − q) log((1 − q + 1e-8) / (1 − p + 1e-8))
             valid_i = (KL_i ≤ δ_hi or p ≤ q) where A_i > 0, (KL_i ≤ δ_lo or p ≥ q) otherwise

with δ_lo, δ_hi the divergence thresholds (verl reads them from clip_ratio_low / clip_ratio_high, default 0.2) and C
= clip_ratio_c = 20 (truncated importance sampling instead of dual clipping, the paper's §5.4). The ratio is
always per token. verl aggregates with loss_agg_mode token-mean: loss types `dppo_tv` / `dppo_kl` are the token mean
of the whole batch.

Needs from the rollout: nothing beyond the tokens — the trust region is against the trainer's old policy (the
engine's logprobs when grpo.old_logprobs is "rollout").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...config_fields import option
from ..loss_types import LossType, Reduction
from ..objective import Objective, ObjectiveOptions, Surrogate, SurrogateInputs


@dataclass(frozen=True)
class DPPOOptions(ObjectiveOptions):
    divergence_low: float = option(0.2, "DPPO's divergence threshold for A <= 0 (verl's clip_ratio_low)", low=0)
    divergence_high: float = option(0.2, "DPPO's divergence threshold for A > 0 (verl's clip_ratio_high)", low=0)
    ratio_cap: float = option(
        20.0, "DPPO's truncation C of the detached importance ratio (verl's clip_ratio_c)", low=0, low_open=True
    )


def _valid_tv(x: SurrogateInputs, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    o = x.options
    return torch.where(x.advantages > 0, p - q <= o.divergence_high, p - q >= -o.divergence_low)


def _valid_kl(x: SurrogateInputs, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    o = x.options
    kl = q * (x.old_logprobs - x.logprobs.detach()) + (1 - q) * torch.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8))
    return torch.where(x.advantages > 0, (kl <= o.divergence_high) | (p <= q), (kl <= o.divergence_low) | (p >= q))


def _dppo(valid_tokens):
    def definition(x: SurrogateInputs) -> Surrogate:
        ratio = torch.exp(torch.clamp(x.logprobs - x.old_logprobs, -20.0, 20.0))
        truncated = torch.clamp(ratio, max=x.options.ratio_cap).detach()
        p, q = torch.exp(x.logprobs.detach()), torch.exp(x.old_logprobs)
        valid = valid_tokens(x, p, q)
        per_token = torch.where(valid, -x.advantages * truncated * x.logprobs, torch.zeros_like(x.logprobs))
        positive = x.advantages > 0
        return Surrogate(per_token, ~valid & ~positive, ~valid & positive, ~valid)

    return definition


DPPO_TV, DPPO_KL = (
    Objective(f"dppo_{name}", _dppo(valid), summary, options=DPPOOptions, masks_tokens=True, levels=("token",))
    for name, valid, summary in (
        ("tv", _valid_tv, "DPPO-Binary-TV: tokens whose probability moved past the TV threshold masked, "
         "truncated-ratio policy gradient"),
        ("kl", _valid_kl, "DPPO-Binary-KL: tokens past the binary-KL threshold (in the advantage's direction) masked"),
    )
)  # fmt: skip
DPPO_TV_LOSS_TYPE = LossType("dppo_tv", DPPO_TV, Reduction.GLOBAL_TOKEN_MEAN, "DPPO-Binary-TV, like dapo")
DPPO_KL_LOSS_TYPE = LossType("dppo_kl", DPPO_KL, Reduction.GLOBAL_TOKEN_MEAN, "DPPO-Binary-KL, like dapo")

"""GMPO (Geometric-Mean Policy Optimization, arXiv 2507.20673): each sequence's objective uses the geometric mean of
its tokens' clipped ratios, −A · exp(mean_i clip(log ρ_i)), far less sensitive to one outlier ratio than GRPO's
arithmetic mean, so the clip range can be wider (the paper: (e^−0.4, e^0.4)).

Definition: the authors' train_zero_math_gmpo.py (callsys/GMPO), as verl's `compute_policy_loss_geo_mean`
(loss mode `geo_mean`, verl/trainer/ppo/core_algos.py, verl-project/verl 1dda039) and TRL's experimental
`GMPOTrainer._compute_loss` (trl/experimental/gmpo, TRL 1.16) write it:

    s_i = ℓ_i − o_i,   ŝ_i = min(s_i, clamp(s_i, −ε_lo, ε_hi)) where A_i > 0, max(...) otherwise   (log space)
    p_b = −A · exp(Σ_{i∈b} m_i ŝ_i / L_b)

the same value for every token of sequence b; loss type `gmpo` reduces with each sequence's token mean, then the
mean over sequences, which gives GMPO's mean over sequences of p_b. The token gates (top_entropy_quantile,
off_policy_mask_threshold) choose the tokens i of the geometric mean, as TRL's GMPOTrainer drops low-entropy
tokens from it (m_i then includes the gate; L_b counts the kept tokens, at least 1). Importance weights against the
engine enter as their geometric mean over the sequence, exp(Σ m log(w + 1e-10) / L_b) (verl's aggregation). TRL
issue #6808: fused loss paths that only know TRL's `loss_type` rows silently train plain GRPO instead; here it is an
objective like any other, so every backend runs it.

Needs from the rollout: nothing beyond the tokens. The ratio is always per token; the geometric mean is GMPO's own
sequence aggregation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...config_fields import option
from ..loss_types import LossType, Reduction
from ..objective import Objective, ObjectiveOptions, Surrogate, SurrogateInputs


@dataclass(frozen=True)
class GMPOOptions(ObjectiveOptions):
    clip_low: float = option(
        0.4, "GMPO's lower clip of the token log-ratio: ratios below e^-clip_low are clipped", low=0
    )
    clip_high: float = option(0.4, "GMPO's upper clip of the token log-ratio: ratios above e^clip_high", low=0)


def gmpo(x: SurrogateInputs) -> Surrogate:
    o, adv, s = x.options, x.advantages, x.log_ratio
    bounded = torch.clamp(s, -o.clip_low, o.clip_high)
    clipped = torch.where(adv > 0, torch.minimum(s, bounded), torch.maximum(s, bounded))
    per_token = -adv * torch.exp(_kept_mean(x, clipped))
    if x.is_weights is not None:
        per_token = per_token * torch.exp(_kept_mean(x, torch.log(x.is_weights + 1e-10)))
    return Surrogate(per_token, (s < -o.clip_low) & (adv < 0), (s > o.clip_high) & (adv > 0))


def _kept_mean(x: SurrogateInputs, values: torch.Tensor) -> torch.Tensor:
    """Σ m v / max(Σ m, 1) over each token's sequence: m, the tokens the geometric mean keeps (`x.mask`, gates
    included)."""
    return x.sequences.sum(values * x.mask) / x.sequences.sum(x.mask).clamp(min=1.0)


GMPO = Objective(
    "gmpo",
    gmpo,
    "GMPO: geometric mean of the clipped token ratios of each sequence",
    options=GMPOOptions,
    whole_sequences=True,
    weights_inside=True,
    gates_inside=True,
    levels=("token",),
)
LOSS_TYPE = LossType("gmpo", GMPO, Reduction.SEQUENCE_MEAN, "GMPO: geometric-mean ratio per sequence, mean over them")

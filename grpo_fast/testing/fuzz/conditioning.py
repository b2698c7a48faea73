"""Keeping a fuzz case's inputs away from the loss's step functions.

Several terms of the loss switch on or off at a point: the clip bounds 1 − ε_lo and 1 + ε_hi, δ and CISPO's cap
ε_hi (on the ratio, per token or per sequence), the off-policy threshold (on a sequence's mean old − current
logprob, for tokens with A < 0) and the entropy quantile of top_entropy_quantile. A computation that is off by
one rounding error legitimately lands on the other side of a switch point when the exact value is within that
error of it, and then its loss and gradients differ by a finite jump that no error bound covers. So the fuzz
cases keep every such value at least `margin` (in log-ratio or entropy units) from its switch point, where
margin = MARGIN · max(1, max |logit|) is ~170 fp32 ulps of a logprob or an entropy:

  * old logprobs: a token (token level) or a sequence (sequence level, off-policy mask) within the margin has
    its old logprob(s) moved by 3 margins, in a random direction, until none is (on-policy needs nothing: the
    ratio is exactly 1 and the mean log-ratio exactly 0 in every precision);
  * the trust-region objectives' masks (icepop's and kpop's on the old against the engine's logprobs, ipo's on
    the current against the engine's, dppo's on the current against the old): the engine's logprobs (the old
    ones for dppo) of a token whose decision changes when its logprobs move by a margin (one at or below 0 not
    above it: no rounding makes a logprob positive) are moved by 3 margins (down where up would end above 0),
    until none does (`keep_trust_regions_apart`); gmpo's clip points are log-ratios, like the clipped ones;
  * the entropy quantile ρ: kept if the threshold falls at least a margin from the two active entropies it
    interpolates (ρ = 0: the largest entropy a margin above the next), else redrawn; if no draw works (tied
    entropies: extreme logits give entropies of exactly 0) the quantile is switched off for that case.
    Where the threshold is an entropy itself (ρ = 0, or one active token) TRL, and so the reference, takes the
    quantile in fp32 and compares the entropies in their own dtype: an fp64 entropy that fp32 rounds up then
    fails its own threshold, which fp32 entropies never do. Such a ρ is redrawn too (it is TRL's fp64 quirk,
    kept by the loss for fp64 inputs, not an error of the fp32 computation under test).
"""

from __future__ import annotations

import math

import torch

MARGIN = 1e-5  # relative to max(1, max |logit|)
_ATTEMPTS = 200


def decision_margin(max_abs_logit: float) -> float:
    return MARGIN * max(1.0, max_abs_logit)


def switch_points(config: dict) -> list[float]:
    """The log-ratios at which the objective of `config` (GRPOLossConfig keywords) switches a term."""
    loss_type = config["loss_type"]
    if loss_type == "cispo":
        return [math.log(config["epsilon_high"])] if config["epsilon_high"] > 0 else []
    if loss_type == "gmpo":
        options = config["objective_options"]
        return [-options["clip_low"], options["clip_high"]]
    if loss_type in ("sapo", "vespo", "ipo", "dppo_tv", "dppo_kl"):  # no switch on the ratio (dppo: continuous)
        return []
    clip_low = config.get("epsilon_low", 0.2)
    clip_high = config.get("epsilon_high", clip_low)
    points = [math.log1p(-clip_low), math.log1p(clip_high)]
    if config.get("delta") is not None:
        points.append(math.log(config["delta"]))
    return points


def keep_decisions_apart(old, logp, advantages, rows, config: dict, margin: float, dtype, gen: torch.Generator):
    """old logprobs [N] fp64 moved (see module docstring) so that, with the current logprobs `logp` [N] fp64 and
    the per-token advantages [N], no ratio decision is within `margin` of a switch point once old is rounded
    to `dtype` (the dtype the entry point receives it in). Returns the moved old logprobs, fp64."""
    points = torch.tensor(switch_points(config), dtype=torch.float64)
    threshold = config.get("off_policy_mask_threshold")
    sequence_level = config.get("importance_sampling_level", "token") == "sequence"
    mask = rows.mask.double()
    active = torch.zeros(rows.batch, dtype=torch.float64).index_add_(0, rows.seq, mask)
    negative = torch.zeros(rows.batch, dtype=torch.float64).index_add_(0, rows.seq, mask * (advantages < 0))
    for _ in range(_ATTEMPTS):
        old = old.to(dtype).double()
        log_ratio = logp - old
        seq_mean = torch.zeros(rows.batch, dtype=torch.float64).index_add_(0, rows.seq, mask * log_ratio)
        seq_mean = seq_mean / active.clamp(min=1.0)
        near_token = torch.zeros_like(mask, dtype=torch.bool)
        near_seq = torch.zeros(rows.batch, dtype=torch.bool)
        if points.numel() and not sequence_level:
            near_token = rows.mask & ((log_ratio[:, None] - points).abs() < margin).any(1)
        if points.numel() and sequence_level:
            near_seq |= (active > 0) & ((seq_mean[:, None] - points).abs() < margin).any(1)
        if threshold is not None:  # the off-policy statistic is the mean of old − current: −seq_mean
            near_seq |= (negative > 0) & ((-seq_mean - threshold).abs() < margin)
        if not near_token.any() and not near_seq.any():
            return old
        move = near_token | (near_seq[rows.seq] & rows.mask)
        token_sign = _random_sign(old.numel(), gen)
        sequence_sign = _random_sign(rows.batch, gen)[rows.seq]  # a sequence moves as a whole
        old = torch.where(move, old + 3 * margin * torch.where(near_token, token_sign, sequence_sign), old)
    raise RuntimeError("conditioning: old logprobs still at a switch point after many moves")


def keep_trust_regions_apart(flat: dict, logp, advantages, rows, params: dict, margin: float, dtype, gen) -> dict:
    """{name: moved values [N] fp64} of the input a trust-region objective's mask compares (`flat`: the case's flat
    inputs, old logprobs already conditioned; `logp` [N] fp64 the current logprobs): the engine's logprobs, or the old
    ones for dppo, moved (see module docstring) until no active token's decision changes when the logprobs it reads
    move by ±`margin`; {} when there is nothing to move (dppo on-policy: no difference to decide on)."""
    config = params["config"]
    name, options = config["loss_type"], config["objective_options"]
    moving = "old_logprobs" if name.startswith("dppo") else "rollout_logprobs"
    if name == "gmpo" or flat[moving] is None:
        return {}
    values = flat[moving]
    for _ in range(_ATTEMPTS):
        values = values.to(dtype).double()
        inputs = {**flat, moving: values}
        old = logp if inputs["old_logprobs"] is None else inputs["old_logprobs"].to(dtype).double()
        engine = None if inputs["rollout_logprobs"] is None else inputs["rollout_logprobs"].to(dtype).double()
        unstable = _unstable(name, options, logp, old, engine, advantages, margin) & rows.mask
        if not unstable.any():
            return {moving: values}
        values = torch.where(unstable, _logprob_step(values, 3 * margin * _random_sign(values.numel(), gen)), values)
    raise RuntimeError(f"conditioning: {name}'s mask still at a switch point after many moves")


def _unstable(name: str, options: dict, logp, old, engine, advantages, margin: float) -> torch.Tensor:
    """[N] bool: tokens whose mask decision differs at some corner of ±margin on the logprobs it reads."""
    decide = {
        "icepop": lambda cur, o, e: _inside(o - e, math.log(options["alpha"]), math.log(options["beta"])),
        "kpop": lambda cur, o, e: torch.maximum(_binary_kl(o, e), _binary_kl(e, o)) <= options["threshold"],
        "ipo": lambda cur, o, e: (cur.exp() - e.exp()).abs() <= options["threshold"],
        "dppo_tv": lambda cur, o, e: _dppo_valid(cur, o, advantages, options, kl=False),
        "dppo_kl": lambda cur, o, e: _dppo_valid(cur, o, advantages, options, kl=True),
    }[name]
    center = decide(logp, old, engine)
    unstable = torch.zeros_like(center)
    for signs in ((1, 1, 1), (1, -1, -1), (-1, 1, -1), (-1, -1, 1), (1, 1, -1), (-1, -1, -1), (1, -1, 1), (-1, 1, 1)):
        shifted = [
            None if t is None else _shift(t, sign * margin) for t, sign in zip((logp, old, engine), signs, strict=True)
        ]
        unstable |= decide(*shifted) != center
    return unstable


def _inside(log_ratio: torch.Tensor, low: float, high: float) -> torch.Tensor:
    return (log_ratio >= low) & (log_ratio <= high)


def _binary_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    p, q = log_p.exp().clamp(1e-8, 1 - 1e-8), log_q.exp().clamp(1e-8, 1 - 1e-8)
    return p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))


def _dppo_valid(cur, old, advantages, options: dict, kl: bool) -> torch.Tensor:
    p, q = cur.exp(), old.exp()
    if kl:
        divergence = q * (old - cur) + (1 - q) * torch.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8))
        up, down = (
            (divergence <= options["divergence_high"]) | (p <= q),
            (divergence <= options["divergence_low"]) | (p >= q),
        )
    else:
        up, down = p - q <= options["divergence_high"], p - q >= -options["divergence_low"]
    return torch.where(advantages > 0, up, down)


def _shift(values: torch.Tensor, step: float) -> torch.Tensor:
    """values + step, but a value at or below 0 stays there: a logprob is at most 0 whatever its rounding
    (log-softmax: x - max - log Σ exp(x - max), with log Σ >= 0). A case's positive inputs (far-off drawn ones)
    move freely."""
    moved = values + step
    return torch.where(values <= 0, moved.clamp(max=0.0), moved)


def _logprob_step(values: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """values + step, where a step that would end above 0 goes down instead: the walk heads for the logprobs (above
    0 every probability is past 1, the masks clamp it to 1 and their divergences cannot move)."""
    moved = values + step
    return torch.where(moved > 0, values - step.abs(), moved)


def _random_sign(count: int, gen: torch.Generator) -> torch.Tensor:
    return torch.where(torch.rand(count, generator=gen) < 0.5, -1.0, 1.0).double()


def robust_quantile(entropy, rows, config: dict, margin: float, gen: torch.Generator) -> bool:
    """Set config["top_entropy_quantile"] to a ρ whose threshold over the active entropies [N] (fp64) is at least
    `margin` from the entropies around it: the drawn one if it is, else one of 20 redraws, else 1.0 (off).
    Returns whether the quantile had to be switched off."""
    rho = config.get("top_entropy_quantile", 1.0)
    if rho >= 1.0:
        return False
    values = entropy[rows.mask].sort().values
    draws = [rho] + torch.rand(20, generator=gen, dtype=torch.float64).tolist() + [0.0]
    for candidate in draws:
        if _clear_threshold(values, candidate, margin):
            config["top_entropy_quantile"] = candidate
            return False
    config["top_entropy_quantile"] = 1.0
    return True


def _kept_at_fp32_threshold(value: float) -> bool:
    """Whether an fp64 entropy that is itself the threshold passes TRL's test `entropy >= fp32 quantile`: only when
    fp32 rounds it down (or not at all). fp32 entropies always pass; the fp64 reference mirrors TRL."""
    return float(torch.tensor(value, dtype=torch.float64).float()) <= value


def _clear_threshold(values: torch.Tensor, rho: float, margin: float) -> bool:
    """Whether the (1 − ρ) quantile (linear interpolation) of the sorted `values` separates them with margin."""
    count = values.numel()
    if count <= 1:  # the threshold is the value itself (or nothing is active)
        return count == 0 or _kept_at_fp32_threshold(float(values[0]))
    if rho == 0.0:  # the largest value exactly
        return bool(values[-1] - values[-2] >= margin) and _kept_at_fp32_threshold(float(values[-1]))
    position = (1.0 - rho) * (count - 1)
    below = math.floor(position)
    fraction = position - below
    if not 0.05 <= fraction <= 0.95:  # fp32 and fp64 could round the position to either side of a value
        return False
    gap = float(values[below + 1] - values[below])
    return fraction * gap >= margin and (1.0 - fraction) * gap >= margin

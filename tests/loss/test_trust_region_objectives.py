"""The trust-region objectives (icepop, kpop, ipo, dppo_tv, dppo_kl, gmpo) against references written here, from
their sources' formulas, independently of grpo_fast's definitions: on materialised fp64 logits, padded [B, T], with
autograd for the gradients (each formula cites where it was read; the objectives' modules cite the same sources).

Shapes, layouts and masks come from the fuzz campaign's own draws (grpo_fast.testing.fuzz.cases: odd B, T, H, V,
padded or packed, holes, empty and masked-out sequences). fp64 on the torch and cpu backends: rtol 1e-9. The triton
backend (fp32, under TRITON_INTERPRET=1 on CPU) has no kernel code for these objectives: its layer 2 falls back to
PyTorch with one logged line naming the objective, and its result is held to the tolerance rule of
grpo_fast.testing.tolerance against the fp64 reference, the fp32 torch backend being the peer.
"""

from __future__ import annotations

import logging
import random

import pytest
import torch

from grpo_fast import GRPOLossConfig, grpo_loss
from grpo_fast.backends import available_backends
from grpo_fast.testing.fuzz.cases import PROFILES, _draw_mask, _draw_shape
from grpo_fast.testing.tolerance import assert_within_rule

OBJECTIVES = ("icepop", "kpop", "ipo", "dppo_tv", "dppo_kl", "gmpo")
# Options that make every mask drop some tokens at the drifts below (the defaults would drop almost none).
OPTIONS = {
    "icepop": dict(alpha=0.8, beta=1.3),
    "kpop": dict(threshold=0.02),
    "ipo": dict(threshold=0.05, adv_tau=0.7, kl_tau=0.1),
    "dppo_tv": dict(divergence_low=0.03, divergence_high=0.05, ratio_cap=1.5),
    "dppo_kl": dict(divergence_low=0.004, divergence_high=0.006, ratio_cap=1.5),
    "gmpo": dict(clip_low=0.15, clip_high=0.1),
}
SEEDS = range(16)


# ------------------------------------------------------------------------------------------------------------------
# The references: padded [B, T] tensors; logp differentiable, the rest fixed; adv [B]; returns (loss, masked [B, T]).
# ------------------------------------------------------------------------------------------------------------------


def _ppo_clip(logp, old, adv, eps_low, eps_high):
    """PPO's clipped surrogate, −min(r A, clip(r, 1 − ε_lo, 1 + ε_hi) A), r = π / π_old."""
    ratio = torch.exp(logp - old)
    return -torch.min(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)


def ref_icepop(logp, old, rollout, adv, mask, o, c):
    """IcePop: OpenRLHF PolicyLoss (is_correction_type icepop): vllm_is = exp(old − rollout) masked to [low, high],
    loss = vllm_is · ppo loss; token mean over the batch's tokens."""
    vllm_is = torch.exp(old - rollout)
    inside = (vllm_is >= o["alpha"]) & (vllm_is <= o["beta"])
    loss = (vllm_is * inside.to(old.dtype)) * _ppo_clip(logp, old, adv, c["epsilon_low"], c["epsilon_high"])
    return (loss * mask).sum() / c["num_items"], ~inside


def ref_kpop(logp, old, rollout, adv, mask, o, c):
    """KPop: AReaL's compute_binary_kl_divergence both ways, masked when the larger exceeds `upper`; the surviving
    tokens weighted by the behaviour importance weight exp(prox − behave), as AReaL's ppo_actor_loss_fn."""

    def bernoulli_kl(log_a, log_b):
        a, b = torch.exp(log_a).clamp(1e-8, 1 - 1e-8), torch.exp(log_b).clamp(1e-8, 1 - 1e-8)
        return a * torch.log(a / b) + (1 - a) * torch.log((1 - a) / (1 - b))

    inside = torch.maximum(bernoulli_kl(old, rollout), bernoulli_kl(rollout, old)) <= o["threshold"]
    weight = torch.exp(old - rollout) * inside.to(old.dtype)
    loss = weight * _ppo_clip(logp, old, adv, c["epsilon_low"], c["epsilon_high"])
    return (loss * mask).sum() / c["num_items"], ~inside


def ref_ipo(logp, old, rollout, adv, mask, o, c):
    """prime-rl ipo_loss_fn: is_masked = |exp(trainer) − exp(inference)| > ipo_threshold; loss = sum(−keep · adv_tau
    · A · ratio + kl_tau · log_ratio²) over loss tokens, normalised by the token count."""
    log_ratio = logp - rollout
    is_masked = torch.abs(torch.exp(logp) - torch.exp(rollout)) > o["threshold"]
    keep = (mask.bool() & ~is_masked).to(logp.dtype)
    per_token = -(keep * o["adv_tau"] * adv * torch.exp(log_ratio)) + o["kl_tau"] * (mask * log_ratio**2)
    return per_token.sum() / c["num_items"], is_masked.detach()


def _dppo(logp, old, adv, mask, o, c, valid):
    """verl's DPPO losses: −A · sg(min(exp(clamp(ℓ − o, ±20)), clip_ratio_c)) · ℓ · valid, token mean."""
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    truncated = torch.clamp(ratio, max=o["ratio_cap"]).detach()
    loss = -adv * truncated * logp * valid.detach().to(logp.dtype)
    return (loss * mask).sum() / c["num_items"], ~valid


def ref_dppo_tv(logp, old, rollout, adv, mask, o, c):
    """verl compute_policy_loss_dppo_tv: valid = (p − q ≤ high) where A > 0, (p − q ≥ −low) otherwise."""
    p, q = torch.exp(logp), torch.exp(old)
    valid = torch.where(adv > 0, (p - q) <= o["divergence_high"], (p - q) >= -o["divergence_low"])
    return _dppo(logp, old, adv, mask, o, c, valid)


def ref_dppo_kl(logp, old, rollout, adv, mask, o, c):
    """verl compute_policy_loss_dppo_kl: binary KL q (o − ℓ) + (1 − q) log((1 − q + 1e-8) / (1 − p + 1e-8))."""
    p, q = torch.exp(logp), torch.exp(old)
    kl = q * (old - logp) + (1 - q) * torch.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8))
    valid = torch.where(adv > 0, (kl <= o["divergence_high"]) | (p <= q), (kl <= o["divergence_low"]) | (p >= q))
    return _dppo(logp, old, adv, mask, o, c, valid)


def ref_gmpo(logp, old, rollout, adv, mask, o, c):
    """verl compute_policy_loss_geo_mean (GMPO): sign-aware clip of the token log-ratio, the sequence's geometric
    mean exp(Σ m ŝ / L), the sequence advantage Σ m A / L, loss = mean over sequences of −Â · ratio (the means exact,
    as the paper writes them, where verl adds 1e-8 to L)."""
    log_ratio = logp - old
    sign = torch.sign(adv)
    clamped = torch.clamp(log_ratio, -o["clip_low"], o["clip_high"])
    chosen = sign * torch.min(sign * log_ratio, sign * clamped)
    length = mask.sum(-1).clamp(min=1.0)
    ratio = torch.exp((chosen * mask).sum(-1) / length)
    advantage = (adv * mask).sum(-1) / length
    clipped = ((log_ratio < -o["clip_low"]) & (adv < 0)) | ((log_ratio > o["clip_high"]) & (adv > 0))  # TRL's metric
    return torch.mean(-advantage * ratio), clipped.detach()


REFERENCES = {name: globals()[f"ref_{name}"] for name in OBJECTIVES}


# ------------------------------------------------------------------------------------------------------------------
# Cases from the fuzz campaign's draws
# ------------------------------------------------------------------------------------------------------------------


def _case(seed: int, dtype=torch.float64):
    """Tensors of fuzz seed `seed`'s shape and mask (layout, holes, masked sequences), normal logits."""
    rng = random.Random(seed)
    params = _draw_shape(rng, PROFILES["full"])
    params |= _draw_mask(rng, params)
    B, T, H, V = params["B"], params["T"], params["H"], params["V"]
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=gen, dtype=torch.float64) / H**0.25
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64) * (3.0 / H**0.25)
    with torch.no_grad():  # tokens sampled from the policy: probabilities large enough for the masks to act on
        ids = torch.multinomial(torch.softmax(hidden @ weight.t(), -1).view(B * T, V), 1, generator=gen).view(B, T)
    lengths = torch.tensor(params["lengths"])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    if params["holes"]:
        mask &= torch.rand(B, T, generator=gen) > 0.25
    if params["masked_out"] == "rows":
        mask[params["masked_rows"]] = False
    elif params["masked_out"] == "batch":
        mask[:] = False
    with torch.no_grad():
        logp = torch.log_softmax(hidden @ weight.t(), -1).gather(-1, ids[..., None])[..., 0]
    old = logp + 0.15 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    rollout = (old + 0.2 * torch.randn(B, T, generator=gen, dtype=torch.float64)).clamp(max=-1e-4)
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    return dict(params=params, hidden=hidden.to(dtype), weight=weight.to(dtype), ids=ids, mask=mask, old=old,
                rollout=rollout, adv=adv)  # fmt: skip


def _config(name: str, backend: str) -> GRPOLossConfig:
    return GRPOLossConfig(
        loss_type=name, epsilon_low=0.1, epsilon_high=0.15, objective_options=OPTIONS[name], backend=backend
    )


def _reference(name: str, case: dict, num_items: float):
    """(loss, dL/dhidden, dL/dweight, masked fraction) of the reference, fp64."""
    hidden = case["hidden"].double().clone().requires_grad_()
    weight = case["weight"].double().clone().requires_grad_()
    logp = torch.log_softmax(hidden @ weight.t(), -1).gather(-1, case["ids"][..., None])[..., 0]
    mask = case["mask"].double()
    constants = dict(epsilon_low=0.1, epsilon_high=0.15, num_items=num_items)
    adv = case["adv"][:, None].expand_as(mask)
    loss, masked = REFERENCES[name](logp, case["old"], case["rollout"], adv, mask, OPTIONS[name], constants)
    grads = torch.autograd.grad(loss, (hidden, weight), allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, (hidden, weight), strict=True)]
    fraction = (masked & case["mask"]).sum().double() / case["mask"].sum().clamp(min=1)
    return loss.detach(), *grads, fraction


def _ours(name: str, case: dict, backend: str, num_items: float):
    """(loss, dL/dhidden, dL/dweight, metrics) of grpo_loss in the case's layout (padded, or packed: the active
    rows of each sequence back to back)."""
    hidden = case["hidden"].clone().requires_grad_()
    weight = case["weight"].clone().requires_grad_()
    mask = case["mask"]
    per_token = dict(completion_ids=case["ids"], completion_mask=mask, old_logprobs=case["old"],
                     rollout_logprobs=case["rollout"])  # fmt: skip
    extra = {}
    rows = hidden
    if case["params"]["layout"] == "packed":
        rows = hidden[mask]
        per_token = {k: v[mask] for k, v in per_token.items()}
        per_token["completion_mask"] = torch.ones_like(per_token["completion_ids"], dtype=torch.bool)
        extra["cu_seqlens"] = torch.nn.functional.pad(mask.sum(1).cumsum(0), (1, 0))
    per_token = {k: (v.to(hidden.dtype) if v.is_floating_point() else v) for k, v in per_token.items()}
    loss, metrics = grpo_loss(
        rows,
        weight,
        advantages=case["adv"].to(hidden.dtype),
        config=_config(name, backend),
        num_items_in_batch=num_items,
        **per_token,
        **extra,
    )
    grad_hidden, grad_weight = torch.autograd.grad(loss, (hidden, weight), allow_unused=True)
    grad_hidden = torch.zeros_like(hidden) if grad_hidden is None else grad_hidden
    return loss.detach(), grad_hidden, grad_weight, metrics


def _cpu_backends():
    names = available_backends(torch.device("cpu"))
    return [
        pytest.param(n, marks=[] if n in names else pytest.mark.skip(reason=f"{n} not here")) for n in ("torch", "cpu")
    ]


@pytest.mark.parametrize("backend", _cpu_backends())
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", OBJECTIVES)
def test_matches_independent_fp64_reference(name, seed, backend):
    case = _case(seed)
    num_items = float(case["mask"].sum()) + 3.0  # a global token count other than this batch's
    want_loss, want_h, want_w, want_fraction = _reference(name, case, num_items)
    loss, grad_h, grad_w, metrics = _ours(name, case, backend, num_items)
    torch.testing.assert_close(loss, want_loss, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad_h, want_h, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad_w, want_w, rtol=1e-9, atol=1e-12)
    fraction = metrics["clip_ratio/region_mean" if name == "gmpo" else "trust_region/masked_mean"]
    torch.testing.assert_close(fraction, want_fraction.double(), rtol=1e-12, atol=0)


def test_the_masks_drop_tokens_in_these_cases():
    """The cases exercise the masks (some tokens dropped, some kept; gmpo: some clipped), or the comparisons above
    would not show a wrong mask."""
    for name in OBJECTIVES:
        fractions = []
        for seed in SEEDS:
            case = _case(seed)
            if case["mask"].any():
                fractions.append(float(_reference(name, case, 1.0)[3]))
        assert 0.05 < sum(fractions) / len(fractions) < 0.95, (name, fractions)


@pytest.mark.triton
@pytest.mark.parametrize("name", OBJECTIVES)
def test_triton_falls_back_to_pytorch_naming_the_objective(name, caplog, monkeypatch):
    if "triton" not in available_backends(torch.device("cpu")):
        pytest.skip("triton does not run here (set TRITON_INTERPRET=1 and install triton)")
    from grpo_fast.loss import token_loss

    monkeypatch.setattr(token_loss, "_LOGGED_FALLBACKS", set())
    case = _case(0, dtype=torch.float32)
    num_items = float(case["mask"].sum())
    oracle = _reference(name, case, num_items)
    peer = _ours(name, case, "torch", num_items)
    with caplog.at_level(logging.INFO, logger="grpo_fast.loss.token_loss"):
        ours = _ours(name, case, "triton", num_items)
    assert any(f"objective {name!r} has no triton layer-2 kernel" in r.getMessage() for r in caplog.records)
    for label, got, want, same_dtype in zip(("loss", "grad_hidden", "grad_weight"), ours, oracle, peer, strict=False):
        assert_within_rule(label, got, same_dtype, want, torch.float32)


@pytest.mark.parametrize("name", ["icepop", "kpop", "ipo"])
def test_refused_by_name_without_the_engines_logprobs(name):
    case = _case(1)
    with pytest.raises(ValueError, match=f"rollout_logprobs: the objective '{name}' needs the inference engine's"):
        grpo_loss(case["hidden"], case["weight"], case["ids"], case["mask"], case["adv"], config=_config(name, "torch"))


@pytest.mark.parametrize("name", ["ipo", "dppo_tv", "dppo_kl", "gmpo"])
def test_objectives_with_their_own_ratio_refuse_sequence_level(name):
    with pytest.raises(ValueError, match=f"importance_sampling_level: the objective '{name}' takes"):
        GRPOLossConfig(loss_type=name, importance_sampling_level="sequence")


@pytest.mark.parametrize("backend", _cpu_backends())
def test_gmpo_drops_low_entropy_tokens_from_its_geometric_mean_as_trl(backend):
    """TRL 1.16's GMPOTrainer._compute_loss with top_entropy_quantile: seq_mask = mask x the high-entropy mask,
    coef_b = exp(Σ seq_mask ŝ / max(Σ seq_mask, 1)), loss = mean_b(−A_b coef_b); the gate chooses the tokens of the
    mean and does not scale the result (multiplying each token's term by the gate gave -0.228 for TRL's -0.438)."""
    generator = torch.Generator().manual_seed(3)
    shape = dict(dtype=torch.float64, generator=generator)
    hidden, weight = torch.randn(3, 6, 16, **shape), torch.randn(40, 16, **shape)
    ids, adv = torch.randint(40, (3, 6), generator=generator), torch.randn(3, **shape)
    mask = torch.ones(3, 6, dtype=torch.float64)
    mask[2, 4:] = 0
    with torch.no_grad():
        old = torch.log_softmax(hidden @ weight.t(), -1).gather(-1, ids[..., None])[..., 0]
    old = old + 0.2 * torch.randn(3, 6, **shape)
    results = {}
    for who in ("trl", "ours"):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if who == "ours":
            config = GRPOLossConfig(loss_type="gmpo", top_entropy_quantile=0.5, backend=backend)
            loss, _ = grpo_loss(h, w, ids, mask, adv, old_logprobs=old, config=config)
        else:
            logp = torch.log_softmax(h @ w.t(), -1)
            token, entropy = logp.gather(-1, ids[..., None])[..., 0], -(logp.exp() * logp).sum(-1)
            threshold = torch.quantile(entropy.detach()[mask > 0], 0.5)  # TRL's get_high_entropy_mask
            seq_mask = mask * ((entropy.detach() >= threshold) & (mask > 0)).double()
            s = token - old
            bounded = torch.clamp(s, -0.4, 0.4)
            clipped = torch.where(adv[:, None] > 0, torch.minimum(s, bounded), torch.maximum(s, bounded))
            coef = torch.exp((clipped * seq_mask).sum(-1) / seq_mask.sum(-1).clamp(min=1.0))
            loss = (-coef * adv).mean()
        results[who] = (loss.detach(), *torch.autograd.grad(loss, (h, w)))
    for ours, trl in zip(results["ours"], results["trl"], strict=True):
        torch.testing.assert_close(ours, trl, rtol=1e-9, atol=1e-12)

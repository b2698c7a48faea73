"""How large a quantity's unavoidable rounding error is, where it is computed from much larger terms.

The tolerance rule (grpo_fast.testing.tolerance) allows 2x the peer's error plus ATOL[dtype] · max(1, max |oracle|),
a slack sized for a quantity about as large as what it is computed from. Some quantities of the loss are not, and
then any evaluation (PyTorch's autograd as much as every backend) is off by rounding errors of the terms, however
small the exact result is. Their sizes, from the fp64 oracle, in two families by the precision that rounds them:

accumulation precision (fp32; fp64 for fp64 cases):
  * a logprob or an entropy: z_y − LSE(z) from logits as large as the GEMM's terms |h| |W|ᵀ + |b| (times the
    inverse temperature), its row's logit terms Z: log p is off by ~u Z, so p by ~u Z relative;
  * the loss and the metrics: to first order, their change when each token's logprob and entropy move by Z (an
    error of ~u Z each), measured on the reference's own layer 2 in two random sign patterns (the bias-corrected
    KL under a sequence-level ratio, for instance, multiplies a logprob's error by e^(ref − logp));
  * a gradient, through p: G p Z + G_H p Z per logit (G, G_H below);
input precision (the case's dtype):
  * a gradient's terms dz = gℓ (onehot(y) − p) − gH p (log p + H), which the Triton kernels (and PyTorch's own
    autograd of a bf16 matmul) round to the input precision before the GEMMs dh = dz W, dW = dzᵀ h:
    T = G (onehot + p) + G_H p (|log p| + H). They cancel when p_y → 1 (gℓ (1 − p_y) with 1 − p_y below
    fp32's resolution of p_y), and gℓ cancels itself under the bias-corrected KL (ρ (1 − e^x) + ρ (e^x − x − 1)
    = −ρ x, x = ref − logp, two terms of |∂L/∂ref| each) or moves with the logprobs' errors as the loss does:
    G = |gℓ| + 2 |∂L/∂ref| + (gℓ's first-order change as above), G_H = |gH| + (its change).
Gradient terms go through the softcap's slope, the inverse temperature and |W|, |h| (dh, dW, db = Σ dz,
dlogits = dz / τ).

The fuzz bound (grpo_fast.testing.fuzz.check) adds a few ulps of each precision times these sizes to the rule's.
Where nothing cancels they are about the quantity's own size, and the addition is far below the rule's slack.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .inputs import FuzzInputs
from .oracle import Trace

STEP = 1e-8  # relative size of the first-order probe (far below the cases' decision margins, 1e-5)
DIRECTIONS = 2


class Scales(NamedTuple):
    """{quantity name: size of its terms} rounded in the accumulation precision, and in the input precision."""

    accumulation: dict[str, float]
    input: dict[str, float]


def conditioning_scales(inputs: FuzzInputs, config, trace: Trace, seed: int) -> Scales:
    """The sizes of the module docstring for the case, from the fp64 oracle's trace."""
    row_terms = logit_terms(inputs, config)
    accumulation = dict.fromkeys(("logp", "entropy", "metric/entropy", "metric/logprob_mean"), _max(row_terms))
    changes, grad_logp, grad_entropy = _first_order(trace, row_terms, seed)
    for name, change in changes.items():
        accumulation[name] = max(accumulation.get(name, 0.0), change)
    grad_logp = grad_logp + trace.grad_logp.abs() + 2.0 * trace.grad_ref.abs()
    grad_entropy = grad_entropy + trace.grad_entropy.abs()
    dz_terms, p_terms = _dz_terms(inputs, config, grad_logp, grad_entropy, row_terms)
    return Scales(accumulation | _through_gemms(inputs, config, p_terms), _through_gemms(inputs, config, dz_terms))


def logit_terms(inputs: FuzzInputs, config) -> torch.Tensor:
    """[N] fp64: each row's largest logit term, k (|h| |W|ᵀ + |b|) with k = logit_scale / temperature (|z| for
    logits given as such)."""
    if inputs.logits is not None:
        z = inputs.logits.double().reshape(-1, inputs.logits.shape[-1]).abs() / config.temperature
    else:
        hidden = inputs.hidden.double().reshape(-1, inputs.hidden.shape[-1]).abs()
        bias = 0.0 if inputs.bias is None else inputs.bias.double().abs()
        z = (hidden @ inputs.weight.double().abs().t() + bias) * (config.logit_scale / config.temperature)
    return z.amax(-1) if z.shape[-1] else z.new_zeros(z.shape[0])


def _first_order(trace: Trace, row_terms: torch.Tensor, seed: int):
    """({loss and metric name: |change| / STEP}, |Δgℓ| / STEP [N], |ΔgH| / STEP [N]) when every token's logp and
    entropy move by ±STEP times its row's logit terms (the largest over DIRECTIONS random sign patterns)."""
    zeros = torch.zeros_like(trace.logp)
    if trace.layer2 is None:
        return {}, zeros, zeros
    gen = torch.Generator().manual_seed(seed)
    base_loss, base_metrics = trace.layer2(trace.logp, trace.entropy)
    base = {"loss": base_loss.detach()} | {f"metric/{k}": v for k, v in base_metrics.items()}
    changes, grad_logp, grad_entropy = dict.fromkeys(base, 0.0), zeros, zeros
    for _ in range(DIRECTIONS):
        signs = torch.where(torch.rand(2, row_terms.numel(), generator=gen) < 0.5, -1.0, 1.0).double()
        logp = (trace.logp + STEP * row_terms * signs[0]).requires_grad_()
        entropy = (trace.entropy + STEP * row_terms * signs[1]).requires_grad_()
        loss, metrics = trace.layer2(logp, entropy)
        moved = {"loss": loss.detach()} | {f"metric/{k}": v for k, v in metrics.items()}
        for name, value in moved.items():
            changes[name] = max(changes[name], float((value - base[name]).abs()) / STEP)
        g_logp, g_entropy = torch.autograd.grad(loss, [logp, entropy], allow_unused=True, materialize_grads=True)
        grad_logp = torch.maximum(grad_logp, (g_logp - trace.grad_logp).abs() / STEP)
        grad_entropy = torch.maximum(grad_entropy, (g_entropy - trace.grad_entropy).abs() / STEP)
    return changes, grad_logp, grad_entropy


def _dz_terms(inputs: FuzzInputs, config, grad_logp, grad_entropy, row_terms):
    """(T, P) [N, V]: dz's terms G (onehot + p) + G_H p (|log p| + H), and p's rounding terms (G + G_H) p Z, both
    as terms of ∂L/∂(h Wᵀ + b) (softcap slope, inverse temperature) or of ∂L/∂logits (1 / τ)."""
    if inputs.logits is not None:
        z = inputs.logits.double().reshape(-1, inputs.logits.shape[-1]) / config.temperature
        chain = torch.full_like(z, 1.0 / config.temperature)
    else:
        hidden = inputs.hidden.double().reshape(-1, inputs.hidden.shape[-1])
        x = hidden @ inputs.weight.double().t() + (0.0 if inputs.bias is None else inputs.bias.double())
        inv_temperature = config.logit_scale / config.temperature
        z, chain = x * inv_temperature, torch.full_like(x, inv_temperature)
        if config.final_logit_softcapping is not None:
            tanh = torch.tanh(x * config.logit_scale / config.final_logit_softcapping)
            z, chain = config.final_logit_softcapping * tanh / config.temperature, chain * (1.0 - tanh.square())
    log_p = torch.log_softmax(z, dim=-1)
    p = log_p.exp()
    entropy = -(p * log_p).sum(-1, keepdim=True)
    onehot = torch.zeros_like(z).scatter_(1, inputs.targets.view(-1, 1), 1.0)
    g_l, g_h = grad_logp.view(-1, 1), grad_entropy.view(-1, 1)
    dz_terms = g_l * (onehot + p) + g_h * p * (log_p.abs() + entropy)
    p_terms = (g_l + g_h) * p * row_terms.view(-1, 1)
    return dz_terms * chain, p_terms * chain


def _through_gemms(inputs: FuzzInputs, config, terms: torch.Tensor) -> dict[str, float]:
    """The largest entry of each gradient formed from |terms| [N, V] of ∂L/∂(logits): |terms| |W|, |terms|ᵀ |h|,
    Σ_rows |terms| (or the terms themselves for logits)."""
    if inputs.logits is not None:
        return {"grad/logits": _max(terms)}
    hidden = inputs.hidden.double().reshape(-1, inputs.hidden.shape[-1]).abs()
    return {
        "grad/hidden": _max(terms @ inputs.weight.double().abs()),
        "grad/weight": _max(terms.t() @ hidden),
        "grad/bias": _max(terms.sum(0)),
    }


def _max(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0

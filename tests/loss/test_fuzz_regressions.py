"""Bugs the fuzz campaign (tests/loss/test_fuzz.py) found, each pinned by the smallest case that shows it."""

from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is defined

import pytest  # noqa: E402

from grpo_fast import GRPOLossConfig, fused_logprobs, grpo_loss  # noqa: E402
from grpo_fast.backends import available_backends  # noqa: E402
from grpo_fast.testing.reference import loss_from_logprobs, naive_logprobs_and_entropy  # noqa: E402
from grpo_fast.testing.tolerance import assert_within_rule  # noqa: E402

BACKENDS = available_backends(torch.device("cpu"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_entropy_gradient_at_large_logits(backend):
    """Logits ~1e10 and an entropy bonus: the torch epilogue formed the entropy part of dz = p (a log p + b) as
    a z − a lse, which cancels at large z and left fp32 gradients with no correct digit."""
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(6, 8, generator=gen), torch.randn(37, 8, generator=gen)
    targets = torch.randint(0, 37, (6,), generator=gen)
    upstream = torch.randn(6, generator=gen), torch.randn(6, generator=gen)

    def grads(h, w, backend=None):
        h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
        if backend is None:
            logp, entropy = naive_logprobs_and_entropy(h[None], w, targets[None], 1.0, logit_scale=1e8)
        else:
            logp, entropy = fused_logprobs(h, w, targets, backend=backend, return_entropy=True, logit_scale=1e8)
        objective = (logp.view(-1) * upstream[0]).sum() + (entropy.view(-1) * upstream[1]).sum()
        return torch.autograd.grad(objective, (h, w))

    oracle, peer, ours = grads(hidden.double(), weight.double()), grads(hidden, weight), grads(hidden, weight, backend)
    for name, a, b, c in zip(("dh", "dW"), ours, peer, oracle, strict=True):
        assert_within_rule(name, a, b, c, torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_the_weight_propagates(backend):
    """A NaN in the lm_head weight (a NaN logit in every row) vanished from the cpu backend's vectorised
    log-sum-exp (its clamps dropped NaN), and every logprob came out finite."""
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(3, 4, generator=gen), torch.randn(300, 4, generator=gen)
    weight[5, 1] = math.nan
    logp, entropy = fused_logprobs(hidden, weight, torch.tensor([0, 7, 299]), backend=backend, return_entropy=True)
    assert torch.isnan(logp).all() and torch.isnan(entropy).all()


def _packed(**changes):
    gen = torch.Generator().manual_seed(0)
    args = dict(
        hidden=torch.randn(5, 4, generator=gen),
        weight=torch.randn(11, 4, generator=gen),
        completion_ids=torch.randint(0, 11, (5,), generator=gen),
        completion_mask=torch.ones(5),
        advantages=torch.randn(2, generator=gen),
        cu_seqlens=torch.tensor([0, 2, 5]),
        config=GRPOLossConfig(backend="torch"),
    )
    return grpo_loss(**(args | changes))


def test_packed_completion_mask_values_are_checked():
    """A float mask of 0.5 or 2 was refused in the padded layout only; packed, it counted as active."""
    with pytest.raises(ValueError, match="completion_mask"):
        _packed(completion_mask=torch.tensor([1.0, 0.5, 1.0, 1.0, 0.0]))


def test_num_items_in_batch_of_another_type_is_named():
    """A string count failed inside torch.as_tensor with a TypeError that named nothing."""
    with pytest.raises(ValueError, match="num_items_in_batch"):
        _packed(num_items_in_batch="12")


@pytest.mark.parametrize(
    "options",
    [dict(deterministic="yes"), dict(deterministic=None), dict(max_completion_length=True), dict(workspace_bytes=True)],
)
def test_config_refuses_non_bool_flags_and_bool_counts(options):
    """GRPOLossConfig accepted deterministic="yes" (truthy) and None, and True as max_completion_length or
    workspace_bytes (an int subclass: 1)."""
    with pytest.raises(ValueError, match=next(iter(options))):
        GRPOLossConfig(**options)


@pytest.mark.parametrize(
    "options",
    [dict(workspace_bytes=-5), dict(workspace_bytes=2.5), dict(return_entropy="yes"), dict(deterministic="yes")],
)
def test_fused_logprobs_refuses_bad_options(options):
    """fused_logprobs took workspace_bytes=-5 (one row per chunk) and return_entropy="yes" (a tuple) without a
    word, and 2.5 or a non-bool deterministic failed inside the op with an error naming neither."""
    hidden, weight = torch.randn(3, 4), torch.randn(11, 4)
    with pytest.raises(ValueError, match=next(iter(options))):
        fused_logprobs(hidden, weight, torch.tensor([0, 1, 2]), backend="torch", **options)


def test_reference_keeps_num_items_in_batch_in_fp64():
    """A bug of the reference, not of the loss: the fp64 reference took a fractional num_items_in_batch through
    torch.as_tensor(float), an fp32 tensor, and was off by ~3e-8 relative, far above an fp64 case's bound."""
    logp = torch.full((1, 3), -1.0, dtype=torch.float64)
    advantages, mask = torch.ones(1, dtype=torch.float64), torch.ones_like(logp)
    loss, _ = loss_from_logprobs(logp, logp, mask, advantages, num_items_in_batch=3.1, config=GRPOLossConfig())
    assert loss.item() == pytest.approx(-3 / 3.1, rel=1e-15, abs=0)  # on-policy dapo: −Σ A / num_items


@pytest.mark.parametrize("backend", BACKENDS)
def test_soft_cap_gradient_where_tanh_saturates(backend):
    """Every logit at a saturated soft cap (|x| / c > 300: the slope 1 − tanh² underflows, the gradients are 0)
    under a large upstream gradient: the Triton backward formed the slope as (1 − t)(1 + t) from t = tanh read back
    from the rounded logit, one ulp off 1, and its gradients were ~2e-7 · dz (~0.1 here) instead of 0."""
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(6, 8, generator=gen), torch.randn(37, 8, generator=gen)
    bias = 200.0 * torch.randint(0, 2, (37,), generator=gen).mul(2).sub(1).float()  # ±200: |x| > 180
    targets = torch.randint(0, 37, (6,), generator=gen)
    upstream = 1e6 * torch.randn(6, generator=gen)
    head = dict(logit_scale=1.1025997822134437, final_logit_softcapping=0.6005137958114134)
    temperature = 2.3458930486101353  # the fuzz case's head (seed 1360 of the triton backend)

    def grads(h, w, b, backend=None):
        h, w, b = (t.clone().requires_grad_() for t in (h, w, b))
        if backend is None:
            logp, _ = naive_logprobs_and_entropy(h[None], w, targets[None], temperature, bias=b, **head)
        else:
            logp = fused_logprobs(h, w, targets, temperature, backend=backend, bias=b, **head)
        return torch.autograd.grad((logp.view(-1) * upstream.to(logp.dtype)).sum(), (h, w, b))

    inputs = (hidden, weight, bias)
    oracle, peer = grads(*(t.double() for t in inputs)), grads(*inputs)
    ours = grads(*inputs, backend=backend)
    for name, a, b, c in zip(("dh", "dW", "db"), ours, peer, oracle, strict=True):
        assert_within_rule(name, a, b, c, torch.float32)

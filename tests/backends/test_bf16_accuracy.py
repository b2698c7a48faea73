"""bf16 inputs, fp32 results: every backend's loss and logprobs are the fp32-accurate values of the bf16
inputs, not bf16-rounded logits. The oracle is fp64 on the same bf16 values (upcast exactly), so what is
measured is the backend's own rounding, not the inputs'.

Bounds, per backend, on one on-policy batch with a KL term (no clip decision to flip):
  * loss, per-token logprobs and entropies: relative 1e-5 (fp32 accumulation; bf16-rounded logits are off
    by about 2^-9 of the logit range, ~1e-3 here, and fail it);
  * gradients of hidden and weight, returned in the inputs' bf16: max error at most 0.6% of the largest
    gradient (bf16's own rounding of the exact value is 2^-9 relative, 0.2%) where the backward runs in fp32
    (torch, cpu), 1% for Triton, whose backward rounds ∂L/∂z to the operands' bf16 before its dots, as tensor
    cores need (one more 2^-9 rounding per summed term).
"""

from __future__ import annotations

import pytest
import torch

from grpo_fast import GRPOLossConfig, grpo_loss
from grpo_fast.backends import available_backends
from grpo_fast.loss import fused_logprobs
from grpo_fast.testing.reference import naive_grpo_loss, naive_logprobs_and_entropy
from grpo_fast.testing.synthetic import make_loss_batch

BACKENDS = available_backends(torch.device("cpu"))
CONFIG = dict(loss_type="dapo", beta=0.04, entropy_coef=0.01, temperature=0.9)


GRADIENT_BOUND = {"torch": 6e-3, "cpu": 6e-3, "triton": 1e-2}  # of the largest gradient entry (module doc)


@pytest.fixture(scope="module", params=[0, 5], ids=["seed0", "seed5"])
def batch(request):
    # Logits of standard deviation ~4: bf16 rounding of such logits is ~1e-2 absolute.
    return make_loss_batch(4, 24, 128, 2051, dtype=torch.bfloat16, seed=request.param, logit_scale=4.0)


def _relative(actual: torch.Tensor, oracle: torch.Tensor) -> float:
    return float((actual.double() - oracle).abs().max() / oracle.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_loss_and_gradients_are_fp32_accurate(batch, backend):
    config = GRPOLossConfig(backend=backend, **CONFIG)
    args = (batch.completion_ids, batch.completion_mask, batch.advantages)
    exact_h, exact_w = batch.hidden.double().requires_grad_(), batch.weight.double().requires_grad_()
    exact, _ = naive_grpo_loss(exact_h, exact_w, *args, ref_logprobs=batch.ref_logprobs.double(), config=config)
    exact.backward()
    h, w = batch.hidden.clone().requires_grad_(), batch.weight.clone().requires_grad_()
    loss, _ = grpo_loss(h, w, *args, ref_logprobs=batch.ref_logprobs, config=config)
    loss.backward()
    assert h.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.bfloat16
    assert abs(loss.item() - exact.item()) <= 1e-5 * abs(exact.item()), (loss.item(), exact.item())
    assert _relative(h.grad, exact_h.grad) <= GRADIENT_BOUND[backend]
    assert _relative(w.grad, exact_w.grad) <= GRADIENT_BOUND[backend]


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_logprobs_and_entropies_are_fp32_accurate(batch, backend):
    exact_logp, exact_entropy = naive_logprobs_and_entropy(
        batch.hidden.double(), batch.weight.double(), batch.completion_ids, 0.9
    )
    logp, entropy = fused_logprobs(
        batch.hidden, batch.weight, batch.completion_ids, 0.9, backend=backend, return_entropy=True
    )
    assert logp.dtype == torch.float32
    assert _relative(logp, exact_logp) <= 1e-5
    assert _relative(entropy, exact_entropy) <= 1e-5

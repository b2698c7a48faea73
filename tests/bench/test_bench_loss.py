"""The loss benchmark's variants compute the same loss: each one's gradients equal the naive path's
(a benchmark that timed different work would compare nothing)."""

from __future__ import annotations

import pytest
import torch

from grpo_fast import GRPOLossConfig
from grpo_fast.bench.loss import make_batch, make_step, variants

CPU = torch.device("cpu")


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_every_variant_computes_the_naive_gradients(beta):
    config = GRPOLossConfig(loss_type="dapo", beta=beta, temperature=0.9)
    names = [n for n in variants(CPU) if n not in ("naive", "gemm3")]
    assert {"torch", "trl"} <= set(names)  # TRL is part of the CPU install
    batch = make_batch(96, 32, 257, dtype=torch.float32, device="cpu")
    step, (h_ref, w_ref) = make_step("naive", batch, config)
    step()
    for name in names:
        step, leaves = make_step(name, batch, config)
        step()
        hidden, weight = leaves if leaves else (None, None)
        assert hidden is not None, name
        torch.testing.assert_close(hidden.grad, h_ref.grad, rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(weight.grad, w_ref.grad, rtol=1e-4, atol=1e-6, msg=name)

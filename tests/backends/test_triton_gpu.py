"""Triton backend at real shapes on a CUDA GPU (skipped without one; run by benchmarks/gpu_check.sh).

Real vocabularies: Qwen2.5-7B (H=3584, V=152064) and Llama-3-8B (H=4096, V=128256), bf16, N=4096
tokens. Tolerance rule as in tests/backends/test_triton.py: against an fp64 oracle (the chunked torch
backend on fp64 copies of the same bf16 inputs), the kernel's error is at most twice the torch
backend's own bf16 error plus atol·max(1, |oracle|) (1e-5 forward, 2e-3 gradients, where the bf16
cast of dz dominates). Gradients are compared in relative Frobenius norm as well.
"""

from __future__ import annotations

import pytest
import torch

from grpo_fast.testing.tolerance import assert_within_rule

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.triton,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

REAL_SHAPES = [
    pytest.param(3584, 152064, id="qwen2.5-7b-H3584-V152064"),
    pytest.param(4096, 128256, id="llama3-8b-H4096-V128256"),
]


def _inputs(n, h, v, dtype=torch.bfloat16, seed=0, bias=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(n, h, device="cuda", generator=gen).to(dtype)
    # lm_head-like scale: logits with a std of about 1.5, a few large ones.
    weight = (torch.randn(v, h, device="cuda", generator=gen) * (1.5 / h**0.5)).to(dtype)
    b = (torch.randn(v, device="cuda", generator=gen) * 0.1).to(dtype) if bias else None
    targets = torch.randint(0, v, (n,), device="cuda", generator=gen)
    return hidden, weight, b, targets


def _within_rule(name, actual, torch_result, oracle, atol):
    """The tolerance rule, then the same rule on the relative Frobenius-norm error (a check of the bulk)."""
    assert_within_rule(name, actual, torch_result, oracle, torch.bfloat16, atol=atol)
    rel = ((actual.double() - oracle).norm() / oracle.norm().clamp(min=1e-30)).item()
    torch_rel = ((torch_result.double() - oracle).norm() / oracle.norm().clamp(min=1e-30)).item()
    assert rel <= 2.0 * torch_rel + 1e-6, f"{name}: relative error {rel:.3g} vs torch's {torch_rel:.3g}"


@pytest.mark.parametrize(("h", "v"), REAL_SHAPES)
def test_real_shape_forward_backward(h, v):
    from grpo_fast.backends.chunked import TORCH_BACKEND
    from grpo_fast.backends.triton import TRITON_BACKEND, TRITON_DETERMINISTIC_BACKEND

    n, inv_t = 4096, 1.0 / 0.9
    hidden, weight, _, targets = _inputs(n, h, v)
    gen = torch.Generator(device="cuda").manual_seed(1)
    grad_logp = torch.randn(n, device="cuda", generator=gen) / n
    grad_entropy = torch.randn(n, device="cuda", generator=gen) / n

    oracle = TORCH_BACKEND.forward(hidden.double(), weight.double(), None, targets, inv_t)
    reference = TORCH_BACKEND.forward(hidden, weight, None, targets, inv_t)
    stats = TRITON_BACKEND.forward(hidden, weight, None, targets, inv_t)
    for name in ("logprobs", "entropy", "lse"):
        _within_rule(name, getattr(stats, name), getattr(reference, name), getattr(oracle, name), 1e-5)

    oracle_g = TORCH_BACKEND.backward(
        hidden.double(), weight.double(), None, targets, inv_t, oracle, grad_logp.double(), grad_entropy.double()
    )
    dh_o, dw_o, _ = oracle_g
    reference_g = TORCH_BACKEND.backward(hidden, weight, None, targets, inv_t, reference, grad_logp, grad_entropy)
    del oracle_g
    for backend in (TRITON_BACKEND, TRITON_DETERMINISTIC_BACKEND):
        dh, dw, _ = backend.backward(hidden, weight, None, targets, inv_t, stats, grad_logp, grad_entropy)
        tag = f"deterministic={backend.deterministic}"
        _within_rule(f"dh ({tag})", dh, reference_g[0], dh_o, 2e-3)
        _within_rule(f"dW ({tag})", dw, reference_g[1], dw_o, 2e-3)
        del dh, dw
    torch.cuda.empty_cache()


def test_deterministic_backward_bitwise_at_real_shape():
    from grpo_fast.backends.triton import TRITON_DETERMINISTIC_BACKEND

    hidden, weight, b, targets = _inputs(4096, 3584, 152064, bias=True, seed=2)
    stats = TRITON_DETERMINISTIC_BACKEND.forward(hidden, weight, b, targets, 1.0)
    grad_logp = torch.randn(4096, device="cuda") / 4096
    first = TRITON_DETERMINISTIC_BACKEND.backward(hidden, weight, b, targets, 1.0, stats, grad_logp, None)
    second = TRITON_DETERMINISTIC_BACKEND.backward(hidden, weight, b, targets, 1.0, stats, grad_logp, None)
    for a, c in zip(first, second, strict=True):
        assert torch.equal(a, c)


def test_grpo_loss_triton_vs_torch_real_shape():
    from grpo_fast import GRPOLossConfig, grpo_loss

    batch, length, h, v = 8, 512, 3584, 152064  # N = 4096 tokens
    hidden, weight, _, _ = _inputs(batch * length, h, v, seed=3)
    hidden = hidden.view(batch, length, h)
    ids = torch.randint(0, v, (batch, length), device="cuda")
    mask = torch.rand(batch, length, device="cuda") > 0.1
    adv = torch.randn(batch, device="cuda")
    old = -torch.rand(batch, length, device="cuda") * 12
    ref = -torch.rand(batch, length, device="cuda") * 12
    results = {}
    for backend in ("torch", "triton"):
        hid = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        config = GRPOLossConfig(
            backend=backend, loss_type="grpo", importance_sampling_level="sequence", beta=0.04, entropy_coef=0.01
        )
        loss, metrics = grpo_loss(hid, w, ids, mask, adv, old_logprobs=old, ref_logprobs=ref, config=config)
        loss.backward()
        results[backend] = (loss.detach(), metrics, hid.grad.float(), w.grad.float())
        del hid, w
    (loss_t, met_t, dh_t, dw_t), (loss_r, met_r, dh_r, dw_r) = results["triton"], results["torch"]
    torch.testing.assert_close(loss_t, loss_r, rtol=1e-3, atol=1e-5)
    for key in met_r:
        torch.testing.assert_close(met_t[key], met_r[key], rtol=1e-3, atol=1e-5, msg=key)
    # bf16 gradients: both sides round dz and the result to bf16; compare in relative norm.
    assert ((dh_t - dh_r).norm() / dh_r.norm()).item() < 2e-2
    assert ((dw_t - dw_r).norm() / dw_r.norm()).item() < 2e-2


def test_million_tokens_int64_offsets():
    # N·H = 2.4e9 > 2^31: row offsets must be int64; N/BLOCK_N = 8192 row blocks, 32768 backward tiles.
    from grpo_fast.backends.chunked import TORCH_BACKEND
    from grpo_fast.backends.triton import TRITON_BACKEND

    n, h, v = 1 << 20, 2304, 256
    hidden, weight, _, targets = _inputs(n, h, v, seed=4)
    stats = TRITON_BACKEND.forward(hidden, weight, None, targets, 1.0)
    reference = TORCH_BACKEND.forward(hidden, weight, None, targets, 1.0)
    torch.testing.assert_close(stats.logprobs, reference.logprobs, rtol=0, atol=1e-3)
    torch.testing.assert_close(stats.entropy, reference.entropy, rtol=0, atol=1e-3)
    grad_logp = torch.full((n,), 1.0 / n, device="cuda")
    dh, dw, _ = TRITON_BACKEND.backward(hidden, weight, None, targets, 1.0, stats, grad_logp, None)
    dh_r, dw_r, _ = TORCH_BACKEND.backward(hidden, weight, None, targets, 1.0, reference, grad_logp, None)
    assert ((dh.float() - dh_r.float()).norm() / dh_r.float().norm()).item() < 2e-2
    assert ((dw - dw_r).norm() / dw_r.norm()).item() < 2e-2
    # the last rows (past 2^31 / H) are really written
    assert dh[-1].abs().sum() > 0


def test_no_recompilation_when_tokens_or_temperature_change():
    from grpo_fast.kernels import linear_logprobs as kernels

    fn = kernels._linear_logprobs_fwd_kernel
    caches = getattr(fn, "device_caches", None)
    if caches is None:
        pytest.skip("this Triton version has no JITFunction.device_caches")

    def compiled():
        return sum(len(entry[0]) for entry in caches.values())

    hidden, weight, _, targets = _inputs(4100, 1024, 32000, seed=5)
    kernels.linear_logprobs_forward(hidden[:4096], weight, None, targets[:4096], 1.0)
    before = compiled()
    for n, tau in ((4095, 0.7), (4100, 1.3), (17, 1.0)):
        kernels.linear_logprobs_forward(hidden[:n], weight, None, targets[:n], 1.0 / tau)
    assert compiled() == before

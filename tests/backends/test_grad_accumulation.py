"""dW accumulation of the chunked backends (grpo_fast/backends/chunked.py `_GradAccumulator`) for bf16 /
fp16 weights: every mode against fp64, the mode each device picks, and the CUDA capability probe.
The CUDA modes on a GPU: tests/backends/test_native_gpu.py."""

from __future__ import annotations

import pytest
import torch

from grpo_fast.backends import chunked
from grpo_fast.backends.chunked import _GradAccumulator


def _chunks(rows, step):
    return [slice(s, min(s + step, rows)) for s in range(0, rows, step)]


def _accumulate(hidden, weight, tiles, chunks, inv_t, mode=None):
    acc = _GradAccumulator(hidden, weight, None, inv_t)
    if mode is not None:
        acc.weight_mode = mode
    for rows, dz in zip(chunks, tiles, strict=True):
        acc.add(rows, dz.clone())
    return acc


def _problem(dtype, n=45, h=24, v=3001, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen).to(dtype)
    weight = (torch.randn(v, h, generator=gen) / h**0.5).to(dtype)
    chunks = _chunks(n, 16)  # three chunks, the last one short
    tiles = [torch.randn(c.stop - c.start, v, generator=gen) for c in chunks]
    return hidden, weight, chunks, tiles


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_low_precision_accumulates_fp32_straight_into_dw(dtype):
    """CPU bf16/fp16: one fp32 GEMM per chunk from the unrounded fp32 dz into fp32 dW (fp32-exact), where
    the old vocabulary slices rounded each chunk's bf16 GEMM output before adding it."""
    hidden, weight, chunks, tiles = _problem(dtype)
    inv_t = 1 / 0.7
    acc = _accumulate(hidden, weight, tiles, chunks, inv_t)
    assert acc.weight_mode == "fp32_addmm"
    assert acc.grad_weight.dtype == torch.float32
    ref = sum(dz.double().t() @ hidden[c].double() for c, dz in zip(chunks, tiles, strict=True)) * inv_t
    scale = ref.abs().max().item()
    err = (acc.grad_weight.double() - ref).abs().max().item()
    assert err <= 1e-5 * scale, err
    old = _accumulate(hidden, weight, tiles, chunks, inv_t, mode="slices")
    old_err = (old.grad_weight.double() - ref).abs().max().item()
    assert err < old_err  # the old path's bf16/fp16 GEMM outputs are rounded before the fp32 add
    assert old_err <= 1e-2 * scale  # ... but stays within low-precision tolerance
    # dh is unchanged: dz rounded to the input dtype, one GEMM with W, in the input dtype
    dh_ref = torch.cat([(dz.to(dtype) @ weight).mul_(inv_t) for dz in tiles])
    torch.testing.assert_close(acc.grad_hidden, dh_ref)


def test_full_precision_modes_unchanged():
    for dtype, mode in ((torch.float32, "addmm"), (torch.float64, "addmm")):
        hidden, weight, chunks, tiles = _problem(dtype, v=257)
        tiles = [t.to(dtype) for t in tiles]
        acc = _accumulate(hidden, weight, tiles, chunks, 0.5)
        assert acc.weight_mode == mode and acc.grad_weight.dtype == dtype
        ref = sum(dz.t() @ hidden[c] for c, dz in zip(chunks, tiles, strict=True)) * 0.5
        torch.testing.assert_close(acc.grad_weight, ref)


def test_out_dtype_mode_plumbing(monkeypatch):
    """The CUDA mode's call, run on CPU through an emulation of torch.addmm(..., out_dtype=fp32, out=C)
    with the semantics the probe checks: C += alpha * A @ B in fp32, in place."""

    def fake_addmm(c, a, b, *, out_dtype, alpha, out):
        assert out is c and out_dtype == torch.float32 and a.dtype == b.dtype == torch.bfloat16
        return out.add_(a.float() @ b.float(), alpha=alpha)

    hidden, weight, chunks, tiles = _problem(torch.bfloat16)
    monkeypatch.setattr(chunked.torch, "addmm", fake_addmm)
    acc = _accumulate(hidden, weight, tiles, chunks, 2.0, mode="out_dtype_addmm")
    ref = sum(dz.to(torch.bfloat16).double().t() @ hidden[c].double() for c, dz in zip(chunks, tiles, strict=True))
    torch.testing.assert_close(acc.grad_weight.double(), 2.0 * ref, rtol=1e-5, atol=1e-5)


def test_probe_on_cpu_and_on_failures(monkeypatch):
    """No out_dtype GEMM on CPU; an error or a wrong answer from torch.addmm means "not supported"."""
    assert chunked._probe_fp32_addmm(torch.device("cpu")) is False

    def raising(*args, **kwargs):
        raise RuntimeError("self and mat2 must have the same dtype, but got Float and BFloat16")  # torch 2.8/2.9

    def ignores_c(c, a, b, *, out_dtype, beta=1.0, alpha, out):  # beta = 0 always: would drop the accumulated dW
        return out.copy_(alpha * (a.float() @ b.float()))

    def reads_c_at_beta_0(c, a, b, *, out_dtype, beta=1.0, alpha, out):  # 0 * NaN: a NaN workspace leaks
        return out.mul_(beta).add_(a.float() @ b.float(), alpha=alpha)

    def correct(c, a, b, *, out_dtype, beta=1.0, alpha, out):
        return (out.mul_(beta) if beta else out.zero_()).add_(a.float() @ b.float(), alpha=alpha)

    for fn, expected in ((raising, False), (ignores_c, False), (reads_c_at_beta_0, False), (correct, True)):
        monkeypatch.setattr(chunked.torch, "addmm", fn)
        assert chunked._probe_fp32_addmm(torch.device("cpu")) is expected, fn.__name__


def test_probe_draws_no_random_numbers():
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    chunked._probe_fp32_addmm(torch.device("cpu"))
    torch.testing.assert_close(torch.rand(4), expected)

"""The chunked backends' logits GEMM (grpo_fast/backends/chunked.py `ChunkedBackend._logits`) writes the
tempered logits tile straight into the workspace: no tile-sized temporary and no copy, for fp32 on any device
and for bf16 / fp16 on CUDA (emulated here on CPU with the semantics `_probe_fp32_addmm` checks on a GPU)."""

from __future__ import annotations

import pytest
import torch

from grpo_fast.backends import chunked

CPU = torch.device("cpu")
REAL_ADDMM, REAL_MM = torch.addmm, torch.mm


def _problem(dtype, rows=7, h=24, v=301, bias=False):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, h, generator=gen).to(dtype)
    weight = (torch.randn(v, h, generator=gen) / h**0.5).to(dtype)
    b = (torch.randn(v, generator=gen) * 0.1).to(dtype) if bias else None
    return hidden, weight, b


def _reference(hidden, weight, bias, inv_t):
    z = hidden.double() @ weight.double().t()
    return (z if bias is None else z + bias.double()) * inv_t


@pytest.mark.parametrize("bias", [False, True])
def test_fp32_tile_is_the_workspace(bias):
    hidden, weight, b = _problem(torch.float32, bias=bias)
    workspace = torch.full((10, weight.shape[0]), float("nan"))  # longer than the chunk, uninitialised
    z = chunked.ChunkedBackend._logits(hidden, weight, b, 1 / 0.7, workspace[: hidden.shape[0]])
    assert z.data_ptr() == workspace.data_ptr() and z.shape == (hidden.shape[0], weight.shape[0])
    torch.testing.assert_close(z.double(), _reference(hidden, weight, b, 1 / 0.7), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("probe", [True, False], ids=["addmm_alpha", "mm_then_scale"])
@pytest.mark.parametrize("bias", [False, True])
def test_low_precision_gemm_writes_fp32_into_the_workspace(monkeypatch, probe, bias):
    """The CUDA bf16 path: torch.addmm(ws, h, Wᵀ, out_dtype=fp32, beta=0, alpha=1/τ, out=ws) when the probe
    passes, else torch.mm(h, Wᵀ, out_dtype=fp32, out=ws) scaled in place; either way every GEMM output
    lands in the workspace, and the workspace's old contents (NaN) never reach the logits."""
    outs = []

    def fake_addmm(c, a, b, *, out_dtype=None, beta=1.0, alpha=1.0, out=None):
        if out_dtype is None:
            return REAL_ADDMM(c, a, b, beta=beta, alpha=alpha, out=out)
        outs.append(out)
        product = alpha * (a.float() @ b.float())
        return out.copy_(product if beta == 0 else beta * c + product)

    def fake_mm(a, b, *, out_dtype=None, out=None):
        if out_dtype is None:
            return REAL_MM(a, b, out=out)
        outs.append(out)
        return out.copy_(a.float() @ b.float())

    monkeypatch.setattr(chunked.torch, "addmm", fake_addmm)
    monkeypatch.setattr(chunked.torch, "mm", fake_mm)
    monkeypatch.setitem(chunked._FP32_ADDMM_PROBED, CPU, probe)
    hidden, weight, b = _problem(torch.bfloat16, bias=bias)
    workspace = torch.full((hidden.shape[0], weight.shape[0]), float("nan"))
    z = chunked.ChunkedBackend._logits(hidden, weight, b, 1 / 0.7, workspace)
    assert [o.data_ptr() for o in outs] == [workspace.data_ptr()] and z.data_ptr() == workspace.data_ptr()
    torch.testing.assert_close(z.double(), _reference(hidden, weight, b, 1 / 0.7), rtol=1e-5, atol=1e-5)

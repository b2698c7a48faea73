"""The tolerance rule every backend is held to (the flash-attention / Cut Cross-Entropy habit).

A result computed in some input precision may be off the fp64 oracle by at most twice what the plain
PyTorch path (the peer) is off in that same precision, plus a small absolute slack that scales with
the size of the oracle's values:

    max |actual − oracle|  ≤  2 · max |peer − oracle|  +  ATOL[dtype] · max(1, max |oracle|)

ATOL covers the case where the peer happens to be (almost) exact: fp32 1e-5; fp16 / bf16 2e-3
(inputs rounded to 8-11 mantissa bits, fp32 accumulation); fp64 1e-10.
"""

from __future__ import annotations

import torch

ATOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-3}


def max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual − expected| in fp64 (0 for empty tensors)."""
    if actual.numel() == 0:
        return 0.0
    return (actual.double() - expected.double()).abs().max().item()


def rule_bound(peer: torch.Tensor, oracle: torch.Tensor, dtype: torch.dtype, atol: float | None = None) -> float:
    """The rule's bound on max |actual − oracle| for `peer` (PyTorch in the same precision) and `oracle`
    (fp64); `atol` overrides ATOL[dtype]."""
    scale = max(1.0, oracle.double().abs().max().item()) if oracle.numel() else 1.0
    return 2.0 * max_error(peer, oracle) + (ATOL[dtype] if atol is None else atol) * scale


def assert_within_rule(
    name: str,
    actual: torch.Tensor,
    peer: torch.Tensor,
    oracle: torch.Tensor,
    dtype: torch.dtype,
    atol: float | None = None,
) -> None:
    """Assert the rule above for `actual` (ours) against `peer` (PyTorch in the same precision) and
    `oracle` (fp64); `atol` overrides ATOL[dtype]."""
    err, bound = max_error(actual, oracle), rule_bound(peer, oracle, dtype, atol)
    assert err <= bound, (
        f"{name}: error {err:.3g} > bound {bound:.3g} (the peer's own error {max_error(peer, oracle):.3g})"
    )

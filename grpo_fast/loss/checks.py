"""Input validation shared by the public front ends. Every failure names the argument and what
was expected; nothing here runs on the hot path of a kernel."""

from __future__ import annotations

import torch


def require_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    return value


def require_floating(name: str, tensor: torch.Tensor) -> None:
    if not tensor.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor (fp32/bf16/fp16), got {tensor.dtype}")


def require_integer(name: str, tensor: torch.Tensor) -> None:
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise TypeError(f"{name}: expected an integer tensor (int64 token ids), got {tensor.dtype}")


def require_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...], meaning: str) -> None:
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {list(shape)} ({meaning}), got {list(tensor.shape)}")


def require_device(name: str, tensor: torch.Tensor, device: torch.device) -> None:
    if tensor.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (where hidden is), got one on {tensor.device}")


def require_finite(name: str, tensor: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    """No NaN/inf where `mask` (broadcastable, bool) is set; everywhere when mask is None."""
    bad = ~torch.isfinite(tensor)
    if mask is not None:
        bad = bad & mask
    if bool(bad.any()):
        raise ValueError(f"{name}: contains NaN or inf at {int(bad.sum())} active position(s)")


def require_token_ids(name: str, ids: torch.Tensor, vocab: int, mask: torch.Tensor | None = None) -> None:
    """ids in [0, vocab) where `mask` is set (padding positions may hold anything)."""
    bad = (ids < 0) | (ids >= vocab)
    if mask is not None:
        bad = bad & mask
    if bool(bad.any()):
        value = int(ids[bad].flatten()[0])
        raise ValueError(f"{name}: token ids must lie in [0, {vocab}) (vocabulary size), found {value}")


def require_options(workspace_bytes: object, **flags: object) -> None:
    """workspace_bytes a positive int or None; each of `flags` a bool."""
    if workspace_bytes is not None and (
        isinstance(workspace_bytes, bool) or not isinstance(workspace_bytes, int) or workspace_bytes < 1
    ):
        raise ValueError(f"workspace_bytes: expected a positive int or None, got {workspace_bytes!r}")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{name}: expected a bool, got {value!r}")

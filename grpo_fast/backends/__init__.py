"""Backend dispatch for layer 1 (fused linear logprobs).

A backend has `name`, `forward(hidden, weight, bias, targets, inv_temperature, workspace_bytes)` ->
LogprobStats, and `backward(hidden, weight, bias, targets, inv_temperature, stats, grad_logp,
grad_entropy, workspace_bytes)` -> (dh, dW fp32, db fp32 | None). Chunked backends also have
`forward_backward` (gradients formed in the forward pass, see grpo_fast.backends.chunked) and may
name a `token_loss` implementation of layer 2 (default: grpo_fast.loss.token_math.grpo_token_loss).

| name   | device | implementation |
|--------|--------|----------------|
| torch  | any    | chunked PyTorch, the oracle |
| triton | CUDA (CPU under TRITON_INTERPRET=1) | fused Triton kernels in grpo_fast.kernels |
| cuda   | CUDA   | grpo_fast._C: cuBLAS GEMMs + CUDA epilogue |
| cpu    | CPU    | grpo_fast._C: ATen GEMMs + OpenMP epilogue |

Nothing here touches the GPU at import time.
"""

from __future__ import annotations

import importlib
import os

import torch

from .chunked import TORCH_BACKEND, ChunkedBackend, LogprobStats

__all__ = ["ChunkedBackend", "LogprobStats", "available_backends", "get_backend"]

# name -> (module, attribute, device types it runs on)
_REGISTRY = {
    "torch": (__name__ + ".chunked", "TORCH_BACKEND", ("cpu", "cuda")),
    "triton": (__name__ + ".triton", "TRITON_BACKEND", ("cuda", "cpu")),
    "cuda": (__name__ + ".native", "CUDA_BACKEND", ("cuda",)),
    "cpu": (__name__ + ".native", "CPU_BACKEND", ("cpu",)),
}
# "auto" tries these in order for each device type.
_AUTO_ORDER = {"cuda": ("triton", "cuda", "torch"), "cpu": ("cpu", "torch")}


def _load(name: str):
    """The backend object, or raise ImportError saying why it is unavailable."""
    module, attribute, _ = _REGISTRY[name]
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as err:
        raise ImportError(f"backend {name!r} is unavailable: {err}") from err


def _runs_on(name: str, device: torch.device) -> bool:
    if name == "triton" and device.type == "cpu":
        return os.environ.get("TRITON_INTERPRET") == "1"
    return device.type in _REGISTRY[name][2]


def get_backend(name: str, device: torch.device):
    """Resolve `name` ("auto" or one of the table) for tensors on `device`."""
    if name == "auto":
        for candidate in _AUTO_ORDER.get(device.type, ("torch",)):
            if not _runs_on(candidate, device):
                continue
            try:
                return _load(candidate)
            except ImportError:
                continue
        return TORCH_BACKEND
    if name not in _REGISTRY:
        raise ValueError(f"backend: expected 'auto' or one of {tuple(_REGISTRY)}, got {name!r}")
    if not _runs_on(name, device):
        hint = " (set TRITON_INTERPRET=1 to run Triton kernels on CPU)" if name == "triton" else ""
        raise ValueError(f"backend: {name!r} does not run on {device.type} tensors{hint}")
    return _load(name)


def available_backends(device: torch.device) -> list[str]:
    """Names of the backends that load and run on `device`."""
    names = []
    for name in _REGISTRY:
        if not _runs_on(name, device):
            continue
        try:
            _load(name)
        except ImportError:
            continue
        names.append(name)
    return names

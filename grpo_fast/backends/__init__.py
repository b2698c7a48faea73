"""Backend dispatch for layer 1 (fused linear logprobs).

A backend has `name`, `forward(hidden, weight, bias, targets, inv_temperature, workspace_bytes, softcap=0)`
-> LogprobStats, and `backward(hidden, weight, bias, targets, inv_temperature, stats, grad_logp,
grad_entropy, workspace_bytes, softcap=0)` -> (dh, dW fp32, db fp32 | None), for the logits
z = c tanh((h Wᵀ + b) / c) · inv_temperature with softcap c > 0, or (h Wᵀ + b) · inv_temperature with
softcap 0 (grpo_fast.loss.head folds a model's logit scale into these two). Chunked backends also have
`forward_backward` (gradients formed in the forward pass, see grpo_fast.backends.chunked) and may
name a `token_loss` implementation of layer 2 (default: grpo_fast.loss.token_math.grpo_token_loss).

| name   | device | implementation |
|--------|--------|----------------|
| torch  | any    | chunked PyTorch, the oracle |
| triton | CUDA (CPU under TRITON_INTERPRET=1) | fused Triton kernels in grpo_fast.kernels |
| cuda   | CUDA   | grpo_fast._C: cuBLAS GEMMs + CUDA epilogue |
| cpu    | CPU    | grpo_fast._C: ATen GEMMs + OpenMP epilogue |

"auto" takes the first backend of `_AUTO_ORDER` that loads and passes a one-time self-check on the
device (a tiny forward and backward against the torch backend): a backend that fails to compile or
computes wrong numbers on this machine is skipped with one warning. The choice is cached per process
and device type.

Nothing here touches the GPU at import time.
"""

from __future__ import annotations

import importlib
import logging
import os

import torch

from .chunked import TORCH_BACKEND, ChunkedBackend, LogprobStats

__all__ = ["ChunkedBackend", "LogprobStats", "available_backends", "get_backend", "self_check"]

# name -> (module, attribute, device types it runs on)
_REGISTRY = {
    "torch": (__name__ + ".chunked", "TORCH_BACKEND", ("cpu", "cuda")),
    "triton": (__name__ + ".triton", "TRITON_BACKEND", ("cuda", "cpu")),
    "cuda": (__name__ + ".native", "CUDA_BACKEND", ("cuda",)),
    "cpu": (__name__ + ".native", "CPU_BACKEND", ("cpu",)),
}
# "auto" tries these in order for each device type.
_AUTO_ORDER = {"cuda": ("triton", "cuda", "torch"), "cpu": ("cpu", "torch")}
_AUTO_CHOICE: dict[str, object] = {}  # device type -> the backend "auto" settled on

logger = logging.getLogger(__name__)


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
        if device.type not in _AUTO_CHOICE:
            _AUTO_CHOICE[device.type] = _choose_auto(device)
        return _AUTO_CHOICE[device.type]
    if name not in _REGISTRY:
        raise ValueError(f"backend: expected 'auto' or one of {tuple(_REGISTRY)}, got {name!r}")
    if not _runs_on(name, device):
        hint = " (set TRITON_INTERPRET=1 to run Triton kernels on CPU)" if name == "triton" else ""
        raise ValueError(f"backend: {name!r} does not run on {device.type} tensors{hint}")
    return _load(name)


def _choose_auto(device: torch.device):
    """The first backend of _AUTO_ORDER that loads and passes `self_check` here; torch otherwise."""
    for candidate in _AUTO_ORDER.get(device.type, ()):
        if candidate == "torch" or not _runs_on(candidate, device):
            continue
        try:
            backend = _load(candidate)
        except ImportError:
            continue
        problem = self_check(backend, device)
        if problem is None:
            return backend
        logger.warning("backend %r failed its self-check on %s and is skipped: %s", candidate, device.type, problem)
    return TORCH_BACKEND


def self_check(backend, device: torch.device) -> str | None:
    """None if `backend` matches the torch backend on a tiny problem on `device` (forward statistics and
    the gradients of hidden and weight, fp32, odd sizes), else what went wrong."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 48, generator=gen).to(device)
    weight = (torch.randn(301, 48, generator=gen) / 7).to(device)
    targets = torch.randint(0, 301, (37,), generator=gen).to(device)
    grad_logp, grad_entropy = (torch.randn(37, generator=gen).to(device) for _ in range(2))
    try:
        want = TORCH_BACKEND.forward(hidden, weight, None, targets, 1.25)
        got = backend.forward(hidden, weight, None, targets, 1.25)
        want_grads = TORCH_BACKEND.backward(hidden, weight, None, targets, 1.25, want, grad_logp, grad_entropy)
        got_grads = backend.backward(hidden, weight, None, targets, 1.25, got, grad_logp, grad_entropy)
    except Exception as err:  # noqa: BLE001 - compile errors, launch failures, missing symbols: all mean "skip it"
        return f"{type(err).__name__}: {err}"
    pairs = [(got.logprobs, want.logprobs), (got.entropy, want.entropy), (got_grads[0], want_grads[0])]
    pairs.append((got_grads[1], want_grads[1]))
    for name, (a, b) in zip(("logprobs", "entropy", "grad_hidden", "grad_weight"), pairs, strict=True):
        if a.shape != b.shape or not torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-4):
            return f"{name} differs from the torch backend by {(a.float() - b.float()).abs().max().item():.3g}"
    return None


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

"""Layer 1 (fused linear logprobs) behind one contract (grpo_fast.backends.base.Backend), by name.

| name   | device | implementation |
|--------|--------|----------------|
| torch  | any    | chunked PyTorch, the oracle |
| triton | CUDA (CPU under TRITON_INTERPRET=1) | fused Triton kernels in grpo_fast.kernels |
| cuda   | CUDA   | grpo_fast._C: cuBLAS GEMMs + CUDA epilogue |
| cpu    | CPU    | grpo_fast._C: ATen GEMMs + OpenMP epilogue |

Built-ins are imported on first use. `register_backend(name, backend)` adds one (checked against the contract
at once, grpo_fast.backends.base.check_backend); the loss's `backend=` option then accepts its name, and a backend
object is also named without registering as "package.module:attribute".

"auto" takes the first backend of `AUTO_ORDER` that loads, runs on the device and passes a one-time
self-check there (a tiny forward and backward against the torch backend): a backend that fails to compile or
computes wrong numbers on this machine is skipped with one warning. The choice is cached per process
and device type.

Nothing here touches the GPU at import time.
"""

from __future__ import annotations

import logging

import torch

from ..registry import Registry
from .base import Backend, Capabilities, ChunkedHooks, LogprobStats, check_backend
from .chunked import TORCH_BACKEND, ChunkedBackend

__all__ = [
    "AUTO_ORDER",
    "BACKENDS",
    "Backend",
    "Capabilities",
    "ChunkedBackend",
    "ChunkedHooks",
    "LogprobStats",
    "available_backends",
    "backend_names",
    "get_backend",
    "register_backend",
    "self_check",
]

BACKENDS = Registry(
    "backend",
    {
        "torch": TORCH_BACKEND,
        "triton": "grpo_fast.backends.triton:TRITON_BACKEND",
        "cuda": "grpo_fast.backends.native:CUDA_BACKEND",
        "cpu": "grpo_fast.backends.native:CPU_BACKEND",
    },
    contract=check_backend,
)
"""The backends by name (the loss's `backend` option; "auto" chooses among them, see AUTO_ORDER)."""
AUTO_ORDER: dict[str, tuple[str, ...]] = {"cuda": ("triton", "cuda", "torch"), "cpu": ("cpu", "torch")}
"""What "auto" tries, in order, per device type."""
_AUTO_CHOICE: dict[str, Backend] = {}  # device type -> the backend "auto" settled on

logger = logging.getLogger(__name__)


def register_backend(name: str, backend: Backend, *, auto_on: tuple[str, ...] = ()) -> Backend:
    """Add `backend` under `name` (checked against the contract now); `auto_on`: device types on which "auto"
    tries it before the torch backend."""
    if name == "auto":
        raise ValueError("backend 'auto' is already registered (it chooses among the others)")
    BACKENDS.register(name, backend)
    for device_type in auto_on:
        order = AUTO_ORDER.get(device_type, ("torch",))
        AUTO_ORDER[device_type] = (*order[:-1], name, order[-1])
        _AUTO_CHOICE.pop(device_type, None)
    return backend


def backend_names() -> tuple[str, ...]:
    """The registered backend names (without "auto")."""
    return BACKENDS.names()


def _load(name: str) -> Backend:
    """The backend object, or ImportError saying why it cannot load."""
    try:
        return BACKENDS.get(name)
    except ValueError as err:
        raise ImportError(f"backend {name!r} is unavailable: {err}") from err


def unavailable_reason(name: str, device: torch.device) -> str | None:
    """None when backend `name` loads and runs on `device`, else why not."""
    try:
        return _load(name).availability(device)
    except ImportError as err:
        return str(err)


def get_backend(name: str, device: torch.device) -> Backend:
    """Resolve `name` ("auto", a registered name or "package.module:attribute") for tensors on `device`."""
    if name == "auto":
        if device.type not in _AUTO_CHOICE:
            _AUTO_CHOICE[device.type] = _choose_auto(device)
        return _AUTO_CHOICE[device.type]
    if name not in BACKENDS and ":" not in str(name):
        raise ValueError(f"backend: expected 'auto' or one of {backend_names()}, got {name!r}")
    backend = _load(name) if name in BACKENDS else BACKENDS.get(name, key="backend")
    reason = backend.availability(device)
    if reason is not None:
        raise ValueError(f"backend: {name!r} does not run on {device.type} tensors here: {reason}")
    return backend


def _choose_auto(device: torch.device) -> Backend:
    """The first backend of AUTO_ORDER that loads, runs and passes `self_check` here; torch otherwise."""
    for candidate in AUTO_ORDER.get(device.type, ()):
        if candidate == "torch" or unavailable_reason(candidate, device) is not None:
            continue
        backend = _load(candidate)
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
    return [name for name in BACKENDS.names() if unavailable_reason(name, device) is None]

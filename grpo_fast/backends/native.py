"""Backends "cpu" and "cuda": the chunked layer 1 of grpo_fast.backends.chunked with the epilogue
kernels of the C++/CUDA extension grpo_fast._C (csrc/).

Per row chunk: a vendor GEMM (ATen/MKL on CPU, cuBLAS on GPU) writes the tempered logits tile
z [R, V] into the workspace; `torch.ops.grpo_fast.logprob_stats` reduces it in one pass (online
max / Σe^{z−m} / Σe^{z−m}(z−m) and the target gather) and `torch.ops.grpo_fast.logprob_grad_`
rewrites it in place into dz = gℓ (onehot(y) − p) − gH p (log p + H) in one read + write; two
more GEMMs give dh and dW. A soft cap (`softcap` κ > 0) is applied inside both ops, element by
element (κ tanh(z / κ) and its slope, see grpo_fast.backends.chunked); κ = 0 runs the plain loops.
Both ops are torch.library custom ops with fake implementations (registered below), so torch.compile
traces through them.

Importing this module raises ImportError when the extension is not built (backend "auto" then
falls back to "torch"); build it with `pip install --no-build-isolation -e .` from the repository. An extension
built from other sources than the csrc/ beside the package is used with a warning (`check_sources`,
grpo_fast.backends.sources).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from .chunked import ChunkedBackend, TorchEpilogue, accumulation_dtype
from .sources import stale_extension

try:
    from grpo_fast import _C
except ImportError as err:
    raise ImportError(
        "the C++/CUDA extension grpo_fast._C is not built "
        f"({err}); build it with `pip install --no-build-isolation -e .` in the grpo_fast repository "
        "(GRPO_FAST_SKIP_EXT=1 skips it; torch, ninja and a C++ compiler with OpenMP are needed)"
    ) from err

__all__ = ["CPU_BACKEND", "CUDA_BACKEND", "NativeEpilogue", "cpu_kernel_isa", "built_with_cuda"]

logger = logging.getLogger(__name__)
CSRC = Path(__file__).resolve().parents[2] / "csrc"  # beside the package in a source checkout (editable install)


def check_sources(csrc: Path = CSRC) -> str | None:
    """Why the loaded extension is stale against the sources in `csrc` (logged as a warning), or None."""
    stale = stale_extension(getattr(_C, "sources_hash", str)() or None, csrc)  # str(): "", built before fingerprints
    if stale is not None:
        logger.warning(stale)
    return stale


STALE = check_sources()


@torch.library.register_fake("grpo_fast::logprob_stats")
def _logprob_stats_fake(logits, targets, softcap=0.0):
    torch._check(logits.dim() == 2, lambda: f"logits: expected a 2-d tile [R, V], got {list(logits.shape)}")
    torch._check(
        targets.device == logits.device,
        lambda: f"targets: expected device {logits.device}, got {targets.device}",
    )
    rows = logits.shape[0]
    dtype = accumulation_dtype(logits.dtype)
    return tuple(logits.new_empty((rows,), dtype=dtype) for _ in range(3))


@torch.library.register_fake("grpo_fast::logprob_grad_")
def _logprob_grad_fake(logits, targets, lse, entropy, grad_logp, grad_entropy, softcap=0.0):
    for name, t in (("targets", targets), ("lse", lse), ("entropy", entropy), ("grad_logp", grad_logp)):
        message = f"{name}: expected device {logits.device}, got {t.device}"
        torch._check(t.device == logits.device, lambda message=message: message)
    return None


class NativeEpilogue:
    """The grpo_fast._C epilogue ops behind the `Epilogue` protocol of grpo_fast.backends.chunked."""

    _fp64_cuda = TorchEpilogue()  # the CUDA kernels are fp32-math only; fp64 tiles on GPU (gradcheck) use torch ops

    def stats(self, z, targets, softcap=0.0):
        """z [R, V] fp32 (left intact), targets [R] int64 -> (logp, entropy, lse), each [R] fp32; logits
        κ tanh(z / κ) when softcap κ > 0."""
        if z.is_cuda and z.dtype == torch.float64:
            return self._fp64_cuda.stats(z, targets, softcap)
        return torch.ops.grpo_fast.logprob_stats(z, targets, softcap)

    def grad_(self, z, targets, lse, entropy, grad_logp, grad_entropy, softcap=0.0):
        """Overwrite z [R, V] with dz = gℓ (onehot − p) − gH p (log p + H) (gH None = 0), times
        1 − tanh²(z / κ) when softcap κ > 0."""
        if z.is_cuda and z.dtype == torch.float64:
            return self._fp64_cuda.grad_(z, targets, lse, entropy, grad_logp, grad_entropy, softcap)
        dtype = accumulation_dtype(z.dtype)
        torch.ops.grpo_fast.logprob_grad_(
            z,
            targets,
            lse.to(dtype).contiguous(),
            entropy.to(dtype).contiguous(),
            grad_logp.to(dtype).contiguous(),
            None if grad_entropy is None else grad_entropy.to(dtype).contiguous(),
            softcap,
        )


def built_with_cuda() -> bool:
    """Whether the CUDA epilogue kernels were compiled into grpo_fast._C."""
    return bool(_C.built_with_cuda())


def cpu_kernel_isa() -> str:
    """The vector ISA clone of the fp32 CPU kernels that this machine runs."""
    return str(_C.cpu_kernel_isa())


# Workspace budgets of one fp32 tile. CPU: see benchmarks/NOTES.md ("C++/CUDA backend") for the
# measured trade-off between GEMM efficiency (rows per chunk) and extra memory.
class _CudaBackend(ChunkedBackend):
    """The CUDA epilogue exists only in an extension compiled with nvcc (setup.py builds a CPU-only one otherwise)."""

    def availability(self, device: torch.device) -> str | None:
        if not built_with_cuda():
            return "grpo_fast._C was built without its CUDA kernels (no CUDA toolkit at build time)"
        return super().availability(device)


CPU_BACKEND = ChunkedBackend("cpu", NativeEpilogue(), 48 << 20, 256 << 20, devices=("cpu",))
CUDA_BACKEND = _CudaBackend("cuda", NativeEpilogue(), 48 << 20, 256 << 20, devices=("cuda",))

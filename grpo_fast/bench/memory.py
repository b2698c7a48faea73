"""A step's peak extra memory, measured the same way by every benchmark (torch only: the loss benchmark's worker
processes import nothing heavier)."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable

import torch

from grpo_fast.bench.common import reset_peak_rss, rss_bytes


def peak_extra_bytes(step: Callable[[], object], device: torch.device, warmup: bool = True) -> int:
    """Peak bytes above the allocations before one call of `step`, after a warm-up call (parameter gradients,
    thread pools) unless `warmup` is False: the CUDA allocator's peak, or on CPU the process's VmHWM above its
    VmRSS, with freed memory returned to the system first."""
    if warmup:
        step()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    _return_freed_memory()
    before = rss_bytes("VmRSS")
    reset_peak_rss()
    step()
    return rss_bytes("VmHWM") - before


def _return_freed_memory() -> None:
    """glibc: every later block above 64 KiB is mmap'd (freed = unmapped at once), and the free blocks
    the heap holds now go back to the system, so the RSS peak of the next step is that step's own."""
    libc = ctypes.CDLL(None)
    libc.mallopt(-3, 65536)  # M_MMAP_THRESHOLD
    libc.malloc_trim(0)

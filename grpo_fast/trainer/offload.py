"""Trainer-state swapping, the trainer side of vLLM's sleep mode.

While the rollout engine generates on a GPU, the optimizer state (and optionally the parameters) live in
pinned CPU memory and the CUDA cache is emptied; they come back before the training phase. On CPU every
call is a no-op. `memory_snapshot` gives the numbers logged at each phase boundary.
"""

from __future__ import annotations

import resource

import torch


def memory_snapshot(prefix: str) -> dict[str, float]:
    """GPU allocated / reserved GiB on CUDA, else the process's peak RSS in GiB."""
    if torch.cuda.is_available():
        return {
            f"mem/{prefix}/allocated_gb": torch.cuda.memory_allocated() / 2**30,
            f"mem/{prefix}/reserved_gb": torch.cuda.memory_reserved() / 2**30,
        }
    return {f"mem/{prefix}/max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


class TrainerStateOffloader:
    def __init__(self, model, optimizer, offload_optimizer: bool = True, offload_params: bool = False) -> None:
        self.model = model
        self.optimizer = optimizer
        self.enabled = torch.cuda.is_available() and next(model.parameters()).is_cuda
        self.offload_optimizer = offload_optimizer and self.enabled
        self.offload_params = offload_params and self.enabled
        self._device = next(model.parameters()).device
        self._pinned: dict[tuple, torch.Tensor] = {}
        self.offloaded = False

    def _to_cpu(self, key, t: torch.Tensor) -> torch.Tensor:
        # Pinned buffers are allocated once and reused by every later offload.
        buf = self._pinned.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = self._pinned[key] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        buf.copy_(t, non_blocking=True)
        return buf

    @torch.no_grad()
    def offload(self) -> None:
        """Optimizer state (+ parameters) -> pinned CPU; gradients dropped; CUDA cache emptied."""
        if not self.enabled or self.offloaded:
            return
        self.optimizer.zero_grad(set_to_none=True)
        for i, p in enumerate(self.model.parameters()):
            state = self.optimizer.state.get(p, {}) if self.offload_optimizer else {}
            for key, value in state.items():
                if torch.is_tensor(value) and value.is_cuda:
                    state[key] = self._to_cpu(("opt", i, key), value)
            if self.offload_params:
                p.data = self._to_cpu(("param", i), p.data)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        self.offloaded = True

    @torch.no_grad()
    def reload(self) -> None:
        """Brings the offloaded state back to the GPU before training."""
        if not self.enabled or not self.offloaded:
            return
        if self.offload_params:
            for p in self.model.parameters():
                p.data = p.data.to(self._device, non_blocking=True)
        if self.offload_optimizer:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    if torch.is_tensor(value) and not value.is_cuda and value.dim() > 0:
                        state[key] = value.to(self._device, non_blocking=True)
        torch.cuda.synchronize()
        self.offloaded = False

"""Trainer-state swapping, the trainer side of vLLM's sleep mode.

While the rollout engine generates on a GPU, the optimizer state (and optionally the parameters) live in
pinned CPU memory, the gradients are dropped and the CUDA cache is emptied; they come back before the
training phase. So does the frozen reference policy of a KL-regularised run (beta > 0) when one is given:
nothing needs it until the loss step's reference-logprob pass. On CPU every call is a no-op.
`memory_snapshot` gives the numbers logged at each phase boundary.
"""

from __future__ import annotations

import logging
import resource

import torch

from grpo_fast.distributed.fsdp import is_sharded

logger = logging.getLogger(__name__)


def memory_snapshot(prefix: str) -> dict[str, float]:
    """On CUDA: torch's allocated / reserved GiB and the device's used GiB (total - free, as the driver
    sees it); else the process's peak RSS in GiB.

    vLLM allocates its weights and KV cache through a pluggable-allocator MemPool and its sleep mode unmaps
    that memory behind torch's back, so allocated/reserved keep counting a sleeping engine: only
    `device_used_gb` shows what sleep freed."""
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        return {
            f"mem/{prefix}/allocated_gb": torch.cuda.memory_allocated() / 2**30,
            f"mem/{prefix}/reserved_gb": torch.cuda.memory_reserved() / 2**30,
            f"mem/{prefix}/device_used_gb": (total - free) / 2**30,
        }
    return {f"mem/{prefix}/max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


class TrainerStateOffloader:
    """Moves the optimizer state (every CUDA tensor in `optimizer.state`, including a capturable/fused
    AdamW's `step`) and optionally the parameters to pinned CPU buffers, allocated once and reused.

    Each offloaded tensor goes back to the device it came from, bit for bit. Gradients are not kept: they
    are recomputed by the next training step (`zero_grad(set_to_none=True)` runs first anyway).

    ref_model: the frozen reference policy (`LossStep.ref_model`, beta > 0), or None. Its parameters go to
    pinned CPU memory with the rest and come back at `reload`, before the loss step's reference-logprob
    pass (its buffers, a rotary cache, stay: they are small). It is never the engine's model, so it moves
    whichever engine generates."""

    def __init__(
        self, model, optimizer, offload_optimizer: bool = True, offload_params: bool = False, ref_model=None
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.enabled = torch.cuda.is_available() and next(model.parameters()).is_cuda
        # FSDP2 all-gathers a sharded parameter from storage of its own, which moving the parameter would
        # leave behind (stale weights after the next optimizer step): parameters of a sharded model stay.
        sharded = is_sharded(model)
        if offload_params and sharded and self.enabled:
            logger.warning("run.offload_params ignored: the policy is sharded with FSDP2 (its shards stay on the GPU)")
        self.offload_optimizer = offload_optimizer and self.enabled
        self.offload_params = offload_params and self.enabled and not sharded
        self.ref_model = ref_model
        self.offload_ref_model = ref_model is not None and self.enabled and not sharded
        self._pinned: dict[tuple, torch.Tensor] = {}
        self._moved: list[tuple[torch.Tensor, torch.device]] = []  # what the last offload moved, from where
        self.offloaded = False

    def _to_cpu(self, key, t: torch.Tensor) -> torch.Tensor:
        buf = self._pinned.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = self._pinned[key] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        buf.copy_(t, non_blocking=True)
        return buf

    @torch.no_grad()
    def offload(self) -> None:
        """Optimizer state (+ parameters, + the reference model's) -> pinned CPU; gradients dropped; CUDA
        cache emptied. An optimizer state sharded over ranks (a DTensor) moves its own shard, under the same
        DTensor."""
        if not self.enabled or self.offloaded:
            return
        self.optimizer.zero_grad(set_to_none=True)
        for i, p in enumerate(self.model.parameters()):
            state = self.optimizer.state.get(p, {}) if self.offload_optimizer else {}
            for key, value in state.items():
                if torch.is_tensor(value):
                    self._move_to_cpu(("opt", i, key), value)
            if self.offload_params:
                self._move_to_cpu(("param", i), p)
        if self.offload_ref_model:
            for i, p in enumerate(self.ref_model.parameters()):
                self._move_to_cpu(("ref", i), p)
        # The device->host copies are asynchronous: wait for them before the GPU blocks are reused.
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        self.offloaded = True

    def _move_to_cpu(self, key, tensor: torch.Tensor) -> None:
        """Points the tensor (its local shard for a DTensor) at a pinned CPU copy, remembering its device;
        every holder of the tensor object sees the move."""
        local = _local_shard(tensor)
        if local.is_cuda:
            self._moved.append((local, local.device))
            local.data = self._to_cpu(key, local.data)

    @torch.no_grad()
    def reload(self) -> None:
        """Brings back exactly what `offload` moved, each tensor to its original device."""
        if not self.enabled or not self.offloaded:
            return
        for tensor, device in self._moved:
            tensor.data = tensor.data.to(device, non_blocking=True)
        self._moved.clear()
        # The pinned sources are overwritten by the next offload: finish the host->device copies first.
        torch.cuda.synchronize()
        self.offloaded = False


def _local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the tensor this rank holds), any other tensor itself."""
    return tensor._local_tensor if hasattr(tensor, "_local_tensor") else tensor

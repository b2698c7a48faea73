"""The process group a run belongs to: one process (world size 1, no collectives) or one rank of a
`torchrun` launch (WORLD_SIZE > 1 in the environment: NCCL on GPUs, gloo on CPU).

Everything the trainer needs across ranks goes through `Distributed`, so the single-process trainer runs
the same code with every collective a no-op."""

from __future__ import annotations

import datetime
import fnmatch
import gc
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class Distributed:
    """rank / world_size of this process; local_rank: its index on the node (the GPU it drives)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_gather_ints(self, value: int) -> list[int]:
        """Every rank's `value`, in rank order."""
        return [int(v) for v in self.all_gather(int(value))]

    def all_gather(self, value: T) -> list[T]:
        """Every rank's `value` (any picklable object), in rank order."""
        if not self.enabled:
            return [value]
        out: list = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def all_gather_equal(self, tensor: torch.Tensor) -> torch.Tensor:
        """The ranks' `tensor`s (same shape on every rank) concatenated along dim 0, in rank order, on the
        tensor's device."""
        if not self.enabled:
            return tensor
        mine = tensor.detach().to(_collective_device()).contiguous()
        parts = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(parts, mine)
        return torch.cat(parts).to(tensor.device)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Σ over ranks of a tensor (a new tensor on the tensor's device; the argument is left as it was)."""
        if not self.enabled:
            return tensor
        out = tensor.detach().to(_collective_device(), copy=True)
        dist.all_reduce(out)
        return out.to(tensor.device)

    def broadcast(self, value):
        """Rank 0's `value` (any picklable object) on every rank."""
        if not self.enabled:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def run_on_main(self, fn: Callable[[], T]) -> T:
        """fn() run on rank 0 only (file system decisions and writes), its result returned on every rank; an
        exception it raises is raised on every rank."""
        if not self.enabled:
            return fn()
        result = error = None
        if self.is_main:
            try:
                result = fn()
            except Exception as exc:  # every rank must leave together, not wait for rank 0 at the next collective
                error = exc
        result, error = self.broadcast((result, error))
        if error is not None:
            raise error
        return result

    def reduce_metrics(
        self,
        metrics: dict,
        sums: tuple[str, ...] = (),
        maxes: tuple[str, ...] = (),
        zero_filled: tuple[str, ...] = (),
        present_only: tuple[str, ...] = (),
        weighted: dict[str, str] | None = None,
    ) -> dict:
        """The step's metrics over ranks (`reduce_gathered` of every rank's numbers); values that are not numbers stay
        this rank's. Every rank gets the same numbers, so decisions taken from them (alarms, stops) agree."""
        if not self.enabled:
            return metrics
        numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        gathered = self.all_gather(numbers)
        return dict(metrics) | reduce_gathered(gathered, sums, maxes, zero_filled, present_only, weighted or {})


def reduce_gathered(
    gathered: list[dict[str, float]],
    sums: tuple[str, ...] = (),
    maxes: tuple[str, ...] = (),
    zero_filled: tuple[str, ...] = (),
    present_only: tuple[str, ...] = (),
    weighted: dict[str, str] | None = None,
) -> dict[str, float]:
    """Each rank's metrics (`gathered`, in rank order) as the step's: a key matching a pattern of `sums` (fnmatch) is
    summed, of `maxes` the maximum; one matching a pattern of `weighted` is the mean weighted by the metric that
    pattern names (a share over each rank's own count: its completions, where ranks drew different numbers); any other
    is the plain mean (each rank's batch an equal share of the step; a per-batch std is thus the mean of the ranks').

    Every rank must log the same keys, except those matching `zero_filled` (a rank without one counts 0, as in a
    histogram's bins) or `present_only` (reduced over the ranks that logged it, as a mean over a subset that may be
    empty on a rank); any other difference is a RuntimeError naming the keys."""
    weighted = weighted or {}
    keys = sorted(set().union(*gathered))
    sparse = [k for k in keys if any(k not in g for g in gathered)]
    unmatched = [k for k in sparse if not _matches(k, zero_filled + present_only)]
    if unmatched:
        raise RuntimeError(f"the ranks logged different metrics this step: {unmatched} on some ranks only")
    out = {}
    for k in keys:
        ranks = [g for g in gathered if k in g or _matches(k, zero_filled)]
        values = [g.get(k, 0.0) for g in ranks]
        weight = next((w for pattern, w in weighted.items() if fnmatch.fnmatchcase(k, pattern)), None)
        if _matches(k, sums):
            out[k] = sum(values)
        elif _matches(k, maxes):
            out[k] = max(values)
        elif weight is not None and all(weight in g for g in ranks) and sum(g[weight] for g in ranks) > 0:
            out[k] = sum(v * g[weight] for v, g in zip(values, ranks, strict=True)) / sum(g[weight] for g in ranks)
        else:
            out[k] = sum(values) / len(values)
    return out


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


def _collective_device() -> torch.device:
    """Where the default group's collectives take their tensors: this rank's GPU for NCCL, the CPU for gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_distributed() -> Distributed:
    """This process's place in the launch: a single process unless WORLD_SIZE > 1 (set by torchrun), in which
    case the default process group is initialised (if it is not yet) and, on GPUs, this rank's device is
    selected (LOCAL_RANK)."""
    if launched_world_size() <= 1:
        return Distributed()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=30))
    return Distributed(dist.get_rank(), dist.get_world_size(), local_rank)


def launched_world_size() -> int:
    """How many processes the launch started (torchrun's WORLD_SIZE; 1 outside a launch)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def close_distributed() -> None:
    """Destroys this process's process groups, if it has any, and lets their threads end: at the end of a launch's
    main, on every rank.

    `destroy_process_group` drops torch.distributed's own references only. The DeviceMesh an FSDP2 model was
    sharded over stays alive in DTensor's sharding caches, and its registry keeps the gloo group, so the group's
    worker threads outlive the run. A worker that is still releasing its last collective's tensors while the
    interpreter shuts down needs the GIL, which finalisation refuses by ending the thread, and that abort
    kills the process (SIGABRT, "terminate called without an active exception") after the run has finished.
    Emptying the registries of the meshes still alive frees the groups while Python is whole: their destructors
    join the workers. vLLM's in-process engine destroys the launch's groups itself when it shuts down (its
    EngineCore's cleanup), so the registries are emptied also where no group is left to destroy.

    Outside a launch (WORLD_SIZE unset or 1) it does nothing: a group there is not the run's but, for example, the
    one a single-process vLLM engine made for itself in the same interpreter, which must outlive the command."""
    if not dist.is_available() or launched_world_size() <= 1:
        return
    if dist.is_initialized():
        dist.destroy_process_group()
    from torch.distributed.device_mesh import DeviceMesh

    gc.collect()  # a model or trainer in a reference cycle lets go of its mesh first
    # by the class's MRO: DeviceMesh's metaclass makes isinstance() probe every object, and some of them warn
    for mesh in [o for o in gc.get_objects() if DeviceMesh in type(o).__mro__]:
        getattr(mesh, "_pg_registry", {}).clear()


def consecutive_group(size: int) -> tuple[dist.ProcessGroup, int]:
    """The gloo process group of this rank's block of `size` consecutive ranks (ranks 0..size-1, size..2size-1,
    ...), for exchanging Python objects, and this rank's index in it. Every rank must call it (each group's
    creation is a collective of the whole world)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = None
    for first in range(0, world, size):
        group = dist.new_group(list(range(first, first + size)), backend="gloo")
        if first <= rank < first + size:
            mine = group
    return mine, rank % size

"""The weights' side of the link between a trainer and its engine processes (rollout.mode async), which may run on
other hosts. The messages and the run's setup go through the authenticated store of grpo_fast.rollout.link_store;
the weights through a process group formed through that store (`WeightLink`): gloo between CPU tensors, bound to
the link's interface, NCCL between GPUs; rank 0 the trainer, rank k the k-th engine process. No weight crosses it
before every engine has shown that it is the group's peer of the authenticated link (`WeightLink.check_peers`).

Nothing here needs the two processes to share a host, memory or a file system.
"""

from __future__ import annotations

import datetime
import secrets
import threading
from collections.abc import Iterable

import torch
import torch.distributed as dist

from grpo_fast.rollout.link_store import LinkStore
from grpo_fast.rollout.weight_check import WeightNameCheck

BACKENDS = ("auto", "gloo", "nccl")
WILDCARDS = ("", "0.0.0.0", "::")


Manifest = list[tuple[str, tuple[int, ...], torch.dtype]]


def choose_backend(requested: str, device: torch.device, engine_has_gpus: bool) -> str:
    """rollout.async_engine.weight_backend: auto is NCCL when the trainer's weights are on a GPU and the engine
    process has GPUs of its own (NCCL cannot join two ranks on one GPU), else gloo."""
    if requested not in BACKENDS:
        raise ValueError(f"rollout.async_engine.weight_backend: expected one of {BACKENDS}, got {requested!r}")
    if requested == "auto":
        return "nccl" if device.type == "cuda" and engine_has_gpus else "gloo"
    return requested


class WeightLink:
    """The weights of a run, from the trainer (rank 0) to its engine processes (ranks 1 .. size - 1), one broadcast
    per tensor in the order of `manifest` [(name, shape, dtype)]. The process group is formed through the link's
    store on first use, gloo bound to the store's `host`, and its peers checked (`check_peers`); forming it waits
    for every side, as does every transfer, up to `timeout_seconds`. `device`: where an engine's receive buffers
    live (a GPU for NCCL)."""

    def __init__(
        self,
        store: LinkStore,
        rank: int,
        size: int,
        manifest: Manifest,
        backend: str,
        device: str,
        timeout_seconds: float,
    ) -> None:
        self.store, self.rank, self.size, self.manifest, self.backend = store, rank, size, manifest, backend
        self.device, self.timeout = torch.device(device), datetime.timedelta(seconds=timeout_seconds)
        self._group = None
        self._buffers: list[torch.Tensor] | None = None

    def group(self):
        if self._group is None:
            store = dist.PrefixStore("weights", self.store)
            if self.backend == "nccl":
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = self.timeout
                group = dist.ProcessGroupNCCL(store, self.rank, self.size, options)
            else:
                options = dist.ProcessGroupGloo._Options()
                options._timeout = self.timeout
                host, gloo = self.store.host, dist.ProcessGroupGloo
                device = gloo.create_default_device() if host in WILDCARDS else gloo.create_device(hostname=host)
                options._devices = [device]
                group = dist.ProcessGroupGloo(store, self.rank, self.size, options)
            self.check_peers(group)
            self._group = group
        return self._group

    def check_peers(self, group) -> None:
        """Shows that the group's peers are the link's. The process group's own sockets authenticate nobody, so
        rank 0 broadcasts a random nonce over the group that it also leaves in the authenticated store; an engine
        compares the two (RuntimeError when they differ: its rank 0 is not the trainer) and says so through the
        store; rank 0 sends no weight until every engine has. A stranger who took an engine's place in the group
        gets that nonce at most, and the run stops at the timeout."""
        nonce = torch.zeros(32, dtype=torch.uint8)
        if self.rank == 0:
            nonce = torch.frombuffer(bytearray(secrets.token_bytes(32)), dtype=torch.uint8)
            self.store.set("link/nonce", nonce.numpy().tobytes())
        sent = nonce.to(self.device)
        group.broadcast(sent, 0).wait()
        if self.rank == 0:
            self.store.wait([f"link/joined/{r}" for r in range(1, self.size)], self.timeout)
        elif sent.cpu().numpy().tobytes() != self.store.get("link/nonce"):
            raise RuntimeError(
                "rollout.mode async: the weights' process group is not the trainer's (its first broadcast is not the "
                "nonce of the authenticated link); no weight taken from it"
            )
        else:
            self.store.set(f"link/joined/{self.rank}", b"1")

    def send(self, tensors: list[torch.Tensor]) -> None:
        """Rank 0: `tensors` in the manifest's order."""
        group = self.group()
        for tensor in tensors:
            group.broadcast(tensor, 0).wait()

    def receive(self) -> list[tuple[str, torch.Tensor]]:
        """An engine's rank: the next weights as (name, tensor) pairs, in buffers reused from one transfer to the
        next."""
        if self._buffers is None:
            self._buffers = [torch.empty(shape, dtype=dtype, device=self.device) for _, shape, dtype in self.manifest]
        group = self.group()
        for buffer in self._buffers:
            group.broadcast(buffer, 0).wait()
        return [(name, buffer) for (name, _, _), buffer in zip(self.manifest, self._buffers, strict=True)]


class WeightSender:
    """The trainer's side of the link to `engines` engine processes: `stage` copies the weights (one copy, at `dtype`
    when given: on the trainer's GPU for NCCL, in host memory for gloo) and `send` broadcasts the copy from a thread,
    so that the trainer does not wait for the engines to reach the end of their rounds. The next `stage` waits for
    that thread; a failed transfer is raised there."""

    def __init__(
        self,
        store: LinkStore,
        weights: Iterable[tuple[str, torch.Tensor]],
        backend: str,
        engine_has_gpus: bool,
        timeout_seconds: float,
        dtype: torch.dtype | None = None,
        engines: int = 1,
    ) -> None:
        weights = [(name, t.detach()) for name, t in weights]
        device = weights[0][1].device if weights else torch.device("cpu")
        self.backend = choose_backend(backend, device, engine_has_gpus)
        stage_on = device if self.backend == "nccl" else torch.device("cpu")  # gloo sends from host memory
        self.staged = {  # floating weights at the engine's dtype when known: half the bytes of fp32 for bf16
            name: t.to(stage_on, dtype=dtype if dtype is not None and t.is_floating_point() else t.dtype, copy=True)
            for name, t in weights
        }
        self.manifest: Manifest = [(name, tuple(t.shape), t.dtype) for name, t in self.staged.items()]
        self.link = WeightLink(store, 0, engines + 1, self.manifest, self.backend, str(stage_on), timeout_seconds)
        self.timeout_seconds = timeout_seconds
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def stage(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copies `weights` into the staged tensors; -> bytes copied. Every staged tensor must come once, under its
        name (`WeightNameCheck`: the whole stream is consumed, as a sharded trainer's gathers need, then
        RuntimeError naming what was not; nothing is announced, so the engine keeps the last weights)."""
        self.finish()
        check = WeightNameCheck(self.staged, "the engine process's weights")
        nbytes = 0
        with torch.no_grad():
            for name, tensor in check.stream(weights):
                self.staged[name].copy_(tensor)
                nbytes += tensor.numel() * tensor.element_size()
        check.raise_if_incomplete()
        return nbytes

    def send(self) -> None:
        """Broadcasts the staged weights from a thread (the engine receives them between its rounds)."""
        self.finish()
        self._thread = threading.Thread(target=self._send, name="grpo_fast-weights", daemon=True)
        self._thread.start()

    def _send(self) -> None:
        try:
            self.link.send(list(self.staged.values()))
        except BaseException as exc:  # noqa: BLE001 - raised in the trainer's thread by `finish`
            self._error = exc

    def finish(self) -> None:
        """Waits for the last transfer (up to the link's timeout); raises its failure."""
        if self._thread is not None:
            self._thread.join(self.timeout_seconds)
            if self._thread.is_alive():
                raise RuntimeError(
                    f"rollout.mode async: the weights did not reach the engine process in {self.timeout_seconds:g} s"
                )
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"rollout.mode async: sending the weights to the engine process failed: {error}")

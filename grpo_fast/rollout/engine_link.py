"""The link between a trainer and its engine process (rollout.mode async), which may run on another host.

The trainer's main process hosts a torch.distributed TCPStore. Messages travel through it as pickled objects in
first-in first-out queues (`Channel`), and the store's keys hold what both sides read: the run's settings and the
weight versions the engines hold. The weights travel through a process group over the same store (`WeightLink`):
gloo between CPU tensors, NCCL between GPUs, rank 0 the trainer, rank k the k-th engine process.

Nothing here needs the two processes to share a host, memory or a file system.
"""

from __future__ import annotations

import datetime
import pickle
import queue
import threading
import time
from collections.abc import Iterable

import torch
import torch.distributed as dist

from grpo_fast.rollout.weight_check import WeightNameCheck

POLL_SECONDS = 0.01
BACKENDS = ("auto", "gloo", "nccl")


def parse_address(address: str, argument: str) -> tuple[str, int]:
    """ "host:port" -> (host, port); ValueError naming `argument` otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{argument}: expected HOST:PORT (e.g. node0:29600), got {address!r}")
    return host, int(port)


def host_store(port: int, timeout_seconds: float) -> dist.TCPStore:
    """The trainer's store, listening on every interface at `port` (0: a free one)."""
    timeout = datetime.timedelta(seconds=timeout_seconds)
    return dist.TCPStore("0.0.0.0", port, None, True, timeout=timeout, wait_for_workers=False)


def connect_store(address: str, timeout_seconds: float) -> dist.TCPStore:
    """A client of the trainer's store at `address`."""
    host, port = parse_address(address, "--connect")
    return dist.TCPStore(host, port, None, False, timeout=datetime.timedelta(seconds=timeout_seconds))


class Channel:
    """A first-in first-out queue of pickled messages in `store`, under `name`. `maxsize` > 0 bounds it for its one
    producer, which checks `full()` before `put`. `get` raises queue.Empty as `queue.Queue.get` does."""

    def __init__(self, store: dist.Store, name: str, maxsize: int = 0) -> None:
        self.store, self.name, self.maxsize = store, name, maxsize

    def put(self, message: object) -> None:
        self.store.queue_push(self.name, pickle.dumps(message))

    def qsize(self) -> int:
        return self.store.queue_len(self.name)

    def full(self) -> bool:
        return self.maxsize > 0 and self.qsize() >= self.maxsize

    def get_nowait(self) -> object:
        try:
            return pickle.loads(self.store.queue_pop(self.name, block=False))
        except dist.QueueEmptyError:
            raise queue.Empty from None

    def get(self, timeout: float) -> object:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.get_nowait()
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(POLL_SECONDS)

    def drain(self) -> list:
        """Every message waiting, oldest first."""
        out = []
        while True:
            try:
                out.append(self.get_nowait())
            except queue.Empty:
                return out


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
    per tensor in the order of `manifest` [(name, shape, dtype)]. The process group is created on first use; its
    creation waits for every side, as does every transfer, up to `timeout_seconds`. `device`: where an engine's
    receive buffers live (a GPU for NCCL)."""

    def __init__(
        self,
        store: dist.Store,
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
                self._group = dist.ProcessGroupNCCL(store, self.rank, self.size, options)
            else:
                self._group = dist.ProcessGroupGloo(store, self.rank, self.size, self.timeout)
        return self._group

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
        store: dist.Store,
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

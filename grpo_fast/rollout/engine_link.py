"""The link between a trainer and its engine processes (rollout.mode async), which may run on other hosts.

The trainer's main process listens (`LinkServer`: on loopback unless the user names an address) and serves a
small store to every peer that proves the run's secret (grpo_fast.rollout.link_auth: a handshake with HMAC-SHA256,
then a message authentication code on every frame); a peer that does not is refused, logged, and learns nothing.
The store holds keys (the run's setup, the weight versions the engines hold) and first-in first-out queues of
typed messages (`Channel`), all encoded as plain data and raw buffers (grpo_fast.rollout.link_codec), never
pickled. The weights travel through a process group formed through the same store (`WeightLink`): gloo between
CPU tensors, bound to the link's interface, NCCL between GPUs; rank 0 the trainer, rank k the k-th engine
process. No weight crosses it before every engine has shown that it is the group's peer of the authenticated
link (`WeightLink.check_peers`).

Nothing here needs the two processes to share a host, memory or a file system.
"""

from __future__ import annotations

import datetime
import logging
import queue
import secrets
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from grpo_fast.rollout.link_auth import Connection, LinkClosed, LinkRefused, accept, connect
from grpo_fast.rollout.link_codec import LinkProtocolError, decode, encode, from_plain, to_plain
from grpo_fast.rollout.weight_check import WeightNameCheck

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.01
BACKENDS = ("auto", "gloo", "nccl")
MAX_HANDSHAKES = 16
"""Connections proving the secret at one time at most; more are closed at once (each has HANDSHAKE_SECONDS)."""
WILDCARDS = ("", "0.0.0.0", "::")


def parse_address(address: str, argument: str) -> tuple[str, int]:
    """ "host:port" -> (host, port); ValueError naming `argument` otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{argument}: expected HOST:PORT (e.g. node0:29600), got {address!r}")
    return host, int(port)


class _Keys:
    """The store's contents, in the trainer's process: values and first-in first-out queues of bytes. `call` runs
    one of OPS; those that wait block the calling thread (one per connection) up to their timeout."""

    OPS = {
        "set": (str, bytes),
        "get": (str, float),
        "add": (str, int),
        "check": (list,),
        "wait": (list, float),
        "delete_key": (str,),
        "num_keys": (),
        "compare_set": (str, bytes, bytes),
        "queue_push": (str, bytes),
        "queue_take": (str,),
        "queue_len": (str,),
    }

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.queues: dict[str, deque[bytes]] = defaultdict(deque)
        self.changed = threading.Condition()
        self.closed = False

    def call(self, op: str, *args):
        return getattr(self, op)(*args)

    def set(self, key: str, value: bytes) -> None:
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    def get(self, key: str, timeout: float) -> bytes:
        self.wait([key], timeout)
        with self.changed:
            return self.values[key]

    def add(self, key: str, amount: int) -> int:
        with self.changed:
            value = int(self.values.get(key, b"0")) + amount
            self.values[key] = str(value).encode()
            self.changed.notify_all()
            return value

    def check(self, keys: list[str]) -> bool:
        with self.changed:
            return all(k in self.values for k in keys)

    def wait(self, keys: list[str], timeout: float) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: self.closed or all(k in self.values for k in keys), timeout):
                raise TimeoutError(f"the engine link's store: {keys} not set within {timeout:g} s")
            if self.closed:
                raise LinkClosed("the engine link is closed")

    def delete_key(self, key: str) -> bool:
        with self.changed:
            return self.values.pop(key, None) is not None

    def num_keys(self) -> int:
        with self.changed:
            return len(self.values)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """As torch's stores: set `desired` when the value is `expected` (or absent, `expected` empty)."""
        with self.changed:
            current = self.values.get(key)
            if (current is None and not expected) or current == expected:
                self.values[key] = current = desired
                self.changed.notify_all()
            return expected if current is None else current

    def queue_push(self, name: str, value: bytes) -> None:
        with self.changed:
            self.queues[name].append(value)

    def queue_take(self, name: str) -> bytes | None:
        with self.changed:
            items = self.queues.get(name)
            return items.popleft() if items else None

    def queue_len(self, name: str) -> int:
        with self.changed:
            return len(self.queues.get(name, ()))

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()

    def answer(self, body: bytes) -> bytes:
        """A peer's request (an encoded {"op", "args"}) -> the encoded reply: {"ok": result}, or {"error": text,
        "timeout": bool} for a request that is not one of OPS with its argument types, or that failed."""
        try:
            request = decode(body)
            op, args = (request.get("op"), request.get("args")) if isinstance(request, dict) else (None, None)
            types = self.OPS.get(op) if isinstance(op, str) else None
            if types is None or not isinstance(args, list) or not _typed_args(args, types):
                raise LinkProtocolError(f"not a request of the engine link's store: {str(request)[:200]}")
            return encode({"ok": self.call(op, *args)})
        except TimeoutError as exc:
            return encode({"error": str(exc), "timeout": True})
        except (LinkProtocolError, ValueError) as exc:
            return encode({"error": str(exc), "timeout": False})


def _typed_args(args: list, types: tuple[type, ...]) -> bool:
    def fits(value, kind) -> bool:
        if kind is float:
            return type(value) in (int, float)
        if kind is list:
            return isinstance(value, list) and all(isinstance(v, str) for v in value)
        return type(value) is kind

    return len(args) == len(types) and all(map(fits, args, types))


def _as_bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class LinkStore(dist.Store):
    """The link's store, as a torch.distributed Store so that the weights' process group meets through it (its
    rendezvous is then as authenticated as the link). `call(op, *args)` runs an op of the trainer's store: in its
    own process directly, in an engine's over its authenticated connection. `host`: the interface this side's
    process group binds (the trainer's listening address; an engine's end of its connection). Blocking ops wait
    up to `timeout_seconds`, then raise TimeoutError."""

    def __init__(self, call: Callable, timeout_seconds: float, host: str) -> None:
        super().__init__()
        self._call, self.timeout_seconds, self.host = call, timeout_seconds, host

    def clone(self) -> LinkStore:
        """torch's Store contract (a client for another thread): this one, whose calls are thread-safe."""
        return self

    def set(self, key: str, value) -> None:
        self._call("set", key, _as_bytes(value))

    def get(self, key: str) -> bytes:
        return self._call("get", key, self.timeout_seconds)

    def add(self, key: str, amount: int) -> int:
        return self._call("add", key, int(amount))

    def check(self, keys: list[str]) -> bool:
        return self._call("check", list(keys))

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        seconds = self.timeout_seconds if timeout is None else timeout.total_seconds()
        self._call("wait", list(keys), seconds)

    # torch's trampoline for Python stores calls these two by their C++ names (store.delete_key and
    # store.num_keys reach them through it too).
    def deleteKey(self, key: str) -> bool:
        return self._call("delete_key", key)

    def getNumKeys(self) -> int:
        return self._call("num_keys")

    def compare_set(self, key: str, expected, desired) -> bytes:
        return self._call("compare_set", key, _as_bytes(expected), _as_bytes(desired))

    def queue_push(self, name: str, value: bytes) -> None:
        self._call("queue_push", name, _as_bytes(value))

    def queue_take(self, name: str) -> bytes | None:
        """The oldest item of queue `name`, None when it is empty (never waits)."""
        return self._call("queue_take", name)

    def queue_len(self, name: str) -> int:
        return self._call("queue_len", name)


class LinkServer:
    """The trainer's end of the link: listens on `host`:`port` (port 0: a free one, then `port`), proves the secret
    `key` with each peer (link_auth.accept), logs and closes those that do not, and serves `store` (this process's
    own view of it) to the others until `close`."""

    def __init__(self, host: str, port: int, key: bytes, timeout_seconds: float) -> None:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(address)
        self._listener.listen()
        self.host, self.port = host, self._listener.getsockname()[1]
        self._key, self._keys = key, _Keys()
        self.store = LinkStore(self._keys.call, timeout_seconds, host)
        self._lock = threading.Lock()
        self._connections: set[Connection] = set()
        self._handshakes = 0
        threading.Thread(target=self._accept_loop, name="grpo_fast-link", daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except OSError:  # closed
                return
            with self._lock:
                busy = self._handshakes >= MAX_HANDSHAKES
                self._handshakes += not busy
            if busy:
                logger.warning("rollout.mode async: refused a connection from %s (too many handshakes at once)", peer)
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock, peer), name="grpo_fast-link-peer", daemon=True).start()

    def _serve(self, sock: socket.socket, peer: tuple) -> None:
        """One peer: the handshake, then its requests until it goes (or fails a frame's check)."""
        try:
            conn = accept(sock, self._key)
        except (LinkRefused, OSError) as exc:
            logger.warning("rollout.mode async: refused a connection from %s:%d (%s)", peer[0], peer[1], exc or "")
            sock.close()
            return
        finally:
            with self._lock:
                self._handshakes -= 1
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._connections.add(conn)
        try:
            while True:
                conn.send(self._keys.answer(conn.recv()))
        except LinkClosed:
            pass
        except LinkRefused as exc:
            logger.warning("rollout.mode async: closed the connection of %s:%d (%s)", peer[0], peer[1], exc)
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def close(self) -> None:
        """Stops listening and closes every connection: the engines see their trainer gone."""
        self._keys.close()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.close()


class _Remote:
    """An engine's requests to the trainer's store over its connection, one at a time."""

    def __init__(self, conn: Connection, address: str) -> None:
        self.conn, self.address, self.lock = conn, address, threading.Lock()

    def call(self, op: str, *args):
        with self.lock:
            self.conn.send(encode({"op": op, "args": list(args)}))
            reply = decode(self.conn.recv())
        if not isinstance(reply, dict) or not ({"ok"} == reply.keys() or "error" in reply):
            raise LinkProtocolError(f"not a reply of the engine link's store: {str(reply)[:200]}")
        if "error" in reply:
            error = TimeoutError if reply.get("timeout") else RuntimeError
            raise error(f"rollout.mode async: the trainer at {self.address}: {reply['error']}")
        return reply["ok"]


def connect_link(address: str, key: bytes, connect_seconds: float) -> LinkStore:
    """An engine's view of the trainer's store at `address` ("host:port"), once both sides proved the secret `key`;
    waits up to `connect_seconds` for the trainer to listen (RuntimeError then), LinkRefused when it turns the
    secret away. Its requests wait up to `connect_seconds` too."""
    host, port = parse_address(address, "--connect")
    deadline = time.monotonic() + connect_seconds
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, min(10.0, deadline - time.monotonic())))
            break
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"rollout.mode async: no trainer answered at {address} in {connect_seconds:g} s ({exc})"
                ) from None
            time.sleep(0.1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = connect(sock, key, address)
    # Requests wait as long as the trainer's store says; a trainer host that vanished without closing the
    # connection is found by TCP keepalive within about a minute (its requests then raise LinkClosed).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in ((socket.TCP_KEEPIDLE, 30), (socket.TCP_KEEPINTVL, 10), (socket.TCP_KEEPCNT, 3)):
        sock.setsockopt(socket.IPPROTO_TCP, option, value)
    return LinkStore(_Remote(conn, address).call, connect_seconds, sock.getsockname()[0])


class Channel:
    """A first-in first-out queue of typed messages in `store`, under `name`: each a dataclass among `messages`,
    encoded as plain data (link_codec) and checked field by field against its type on arrival (then by its own
    __post_init__); anything else is a LinkProtocolError naming the queue. `maxsize` > 0 bounds it for its one
    producer, which checks `full()` before `put`. `get` raises queue.Empty as `queue.Queue.get` does."""

    def __init__(self, store: LinkStore, name: str, messages: tuple[type, ...], maxsize: int = 0) -> None:
        self.store, self.name, self.maxsize = store, name, maxsize
        self.messages = {cls.__name__: cls for cls in messages}

    def put(self, message: object) -> None:
        kind = type(message).__name__
        if self.messages.get(kind) is not type(message):
            raise TypeError(f"a {kind} is not a message of the link's {self.name!r} queue ({sorted(self.messages)})")
        self.store.queue_push(self.name, encode({"kind": kind, "fields": to_plain(message)}))

    def qsize(self) -> int:
        return self.store.queue_len(self.name)

    def full(self) -> bool:
        return self.maxsize > 0 and self.qsize() >= self.maxsize

    def get_nowait(self) -> object:
        data = self.store.queue_take(self.name)
        if data is None:
            raise queue.Empty
        return self.decode(data)

    def decode(self, data: bytes) -> object:
        """One message from its bytes; LinkProtocolError when they are not a message this queue carries."""
        try:
            plain = decode(data)
            kind = plain.get("kind") if isinstance(plain, dict) else None
            cls = self.messages.get(kind) if isinstance(kind, str) else None
            if cls is None or plain.keys() != {"kind", "fields"}:
                raise LinkProtocolError(f"expected one of {sorted(self.messages)}")
            return from_plain(plain["fields"], cls, cls.__name__)
        except LinkProtocolError as exc:
            where = f"rollout.mode async: not a message of the link's {self.name!r} queue"
            raise LinkProtocolError(f"{where}: {exc}") from None

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

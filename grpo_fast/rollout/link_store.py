"""The engine link's store: the trainer's process serves it (`LinkServer`: on loopback unless the user names an
address) to every peer that proves the run's secret (grpo_fast.rollout.link_auth); a peer that does not is refused,
logged, and learns nothing. It holds keys (the run's setup, the weight versions the engines hold) and first-in
first-out queues of typed messages (`Channel`), encoded as plain data and raw buffers (grpo_fast.rollout.link_codec),
never pickled. `LinkStore` is a torch.distributed Store, so that the weights' process group meets through it
(grpo_fast.rollout.engine_link).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import queue
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable

import torch.distributed as dist

from grpo_fast.rollout.link_auth import Connection, LinkClosed, LinkRefused, LinkUngreeted, accept, connect
from grpo_fast.rollout.link_codec import LinkProtocolError, decode, encode, from_plain, to_plain

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.01
MAX_HANDSHAKES = 16
"""Connections proving the secret at one time at most; more are closed at once, ungreeted (each has HANDSHAKE_SECONDS
in all; an engine tries again until its connect_seconds)."""


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
    """The trainer's end of the link: listens on `host`:`port` (port 0: a free one, then `port`; `loopback`: whether
    that is a loopback address), proves the secret `key` with each peer (link_auth.accept), logs and closes those
    that do not, and serves `store` (this process's own view of it) to the others until `close`."""

    def __init__(self, host: str, port: int, key: bytes, timeout_seconds: float) -> None:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(address)
        self._listener.listen()
        self.host, self.port = host, self._listener.getsockname()[1]
        self.loopback = ipaddress.ip_address(self._listener.getsockname()[0]).is_loopback
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
    waits up to `connect_seconds` for the trainer to listen and greet it (RuntimeError then), LinkRefused when it
    turns the secret away. Its requests wait up to `connect_seconds` too."""
    host, port = parse_address(address, "--connect")
    deadline, sock = time.monotonic() + connect_seconds, None
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, min(10.0, deadline - time.monotonic())))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = connect(sock, key, address)
            break
        except OSError as exc:  # not listening yet, or every handshake slot taken (LinkUngreeted)
            if sock is not None:
                sock.close()
                sock = None
            if time.monotonic() >= deadline:
                why = ""
                if isinstance(exc, LinkUngreeted):
                    why = "its handshake slots stayed taken, see the link's threat model: "
                raise RuntimeError(
                    f"rollout.mode async: no trainer answered at {address} in {connect_seconds:g} s ({why}{exc})"
                ) from None
            time.sleep(0.1)
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

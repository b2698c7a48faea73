"""The engine link's secret and its authenticated connections.

The secret: a random token per run (`new_secret`), or the one the user puts in $GRPO_FAST_LINK_SECRET on both
sides. A trainer hands it to an engine process it spawns through the spawn pipe (never argv, which `ps` shows,
nor its own environment, which every process it starts would inherit); for an engine started apart it writes it
to a file of mode 0600 (`write_secret_file`) whose path it logs, which `grpo-fast engine --secret-file` reads.

A connection proves the secret both ways before anything else crosses it (`accept` on the trainer's side,
`connect` on the engine's), with HMAC-SHA256 and a fresh nonce from each side:

    trainer -> engine   MAGIC, n_t                       (32 random bytes)
    engine  -> trainer  MAGIC, n_e, HMAC(K, "engine" n_t n_e)
    trainer -> engine   HMAC(K, "trainer" n_e n_t)       (or it closes the connection: refused)
    session key         S = HMAC(K, "session" n_t n_e)

Every later frame is [u64 length][body][HMAC(S, direction, sequence number, length, body)]: a frame altered,
replayed, reordered, reflected or carried over from another connection fails its check, and the connection is
closed. The bodies are not encrypted.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import stat
import struct
import tempfile
import time

SECRET_ENV = "GRPO_FAST_LINK_SECRET"
MIN_SECRET_CHARS = 32
MAGIC = b"grpo_fast link 1"
NONCE_BYTES = 32
TAG_BYTES = hashlib.sha256().digest_size
HANDSHAKE_SECONDS = 10.0
MAX_FRAME_BYTES = 1 << 30
_HEADER = struct.Struct("<Q")
_SEQUENCE = struct.Struct("<Q")


class LinkRefused(RuntimeError):
    """The other side did not prove the secret (or is not an engine link)."""


class LinkClosed(ConnectionError):
    """The other side closed the connection, or it broke."""


class LinkUngreeted(LinkClosed):
    """The trainer closed a new connection before greeting it (all its handshake slots taken), or never greeted it
    in HANDSHAKE_SECONDS: worth another try, unlike a refused secret."""


# -- the secret ------------------------------------------------------------------------------------------------


def new_secret() -> str:
    """A random secret for one run: 256 bits, as hex."""
    return secrets.token_hex(32)


def parse_secret(text: str, source: str) -> bytes:
    """The secret's key from its text (surrounding whitespace dropped); ValueError naming `source` when it is too
    short to resist guessing."""
    text = text.strip()
    if len(text) < MIN_SECRET_CHARS:
        raise ValueError(
            f"{source}: the engine link's secret must have at least {MIN_SECRET_CHARS} characters, got {len(text)} "
            "(e.g. `openssl rand -hex 32`)"
        )
    return text.encode()


def write_secret_file(secret: str) -> str:
    """Writes `secret` to a new file only this user can read (mode 0600, created exclusively); -> its path."""
    fd, path = tempfile.mkstemp(prefix="grpo_fast_link_", suffix=".secret")
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return path


def read_secret_file(path: str) -> bytes:
    """The key in the secret file at `path`; ValueError when it is missing or others may read it."""
    try:
        mode = os.stat(path).st_mode
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"--secret-file: cannot read {path!r} ({exc.strerror})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(
            f"--secret-file: {path!r} may be read by other users (mode {stat.S_IMODE(mode):04o}); "
            f"`chmod 600 {path}` first"
        )
    return parse_secret(text, f"--secret-file {path}")


def engine_secret(secret_file: str | None) -> bytes:
    """An engine's key: from `secret_file` when given, else from $GRPO_FAST_LINK_SECRET; ValueError saying where to
    find it when neither holds one."""
    if secret_file:
        return read_secret_file(secret_file)
    text = os.environ.get(SECRET_ENV)
    if text is None:
        raise ValueError(
            f"no link secret: pass --secret-file FILE (the file the trainer logs) or set ${SECRET_ENV} as on the "
            "trainer's side"
        )
    return parse_secret(text, f"${SECRET_ENV}")


# -- connections -----------------------------------------------------------------------------------------------


def _mac(key: bytes, *parts: bytes) -> bytes:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(part)
    return mac.digest()


def _read_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytearray:
    """n bytes from `sock`; TimeoutError once time.monotonic() passes `deadline` (however slowly they trickle in)."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        try:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
            k = sock.recv_into(view[got:])
        except TimeoutError:  # past the deadline, found between reads or by the socket's own timeout
            if deadline is None:
                raise
            raise TimeoutError(f"the handshake took more than {HANDSHAKE_SECONDS:g} s") from None
        if k == 0:
            raise LinkClosed("the other side closed the connection")
        got += k
    return buf


class Connection:
    """An authenticated connection (see module doc): `send` and `recv` whole frames. One thread sends and one
    receives at a time (the callers lock)."""

    def __init__(self, sock: socket.socket, session: bytes, sends: bytes, receives: bytes) -> None:
        self.sock, self._session, self._sends, self._receives = sock, session, sends, receives
        self._sent = self._received = 0

    def send(self, body: bytes) -> None:
        header = _HEADER.pack(len(body))
        tag = _mac(self._session, self._sends, _SEQUENCE.pack(self._sent), header, body)
        self._sent += 1
        try:
            self.sock.sendall(b"".join((header, body, tag)))
        except OSError as exc:
            raise LinkClosed(f"sending on the engine link failed ({exc})") from None

    def recv(self) -> bytes:
        try:
            header = _read_exact(self.sock, _HEADER.size)
            (n,) = _HEADER.unpack(header)
            if n > MAX_FRAME_BYTES:
                raise LinkRefused(f"a frame of {n} bytes, beyond the link's {MAX_FRAME_BYTES}")
            body = _read_exact(self.sock, n)
            tag = _read_exact(self.sock, TAG_BYTES)
        except OSError as exc:
            if isinstance(exc, LinkClosed):
                raise
            raise LinkClosed(f"receiving on the engine link failed ({exc})") from None
        expected = _mac(self._session, self._receives, _SEQUENCE.pack(self._received), header, body)
        if not hmac.compare_digest(tag, expected):
            raise LinkRefused("a frame failed its authentication (altered, replayed or out of order)")
        self._received += 1
        return bytes(body)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def accept(sock: socket.socket, key: bytes) -> Connection:
    """The trainer's side of the handshake on a new connection; LinkRefused (or LinkClosed, OSError on a timeout)
    when the peer does not prove the secret within HANDSHAKE_SECONDS. The caller closes the socket then."""
    deadline = time.monotonic() + HANDSHAKE_SECONDS
    sock.settimeout(HANDSHAKE_SECONDS)
    ours = secrets.token_bytes(NONCE_BYTES)
    sock.sendall(MAGIC + ours)
    reply = _read_exact(sock, len(MAGIC) + NONCE_BYTES + TAG_BYTES, deadline)
    magic, theirs, proof = (bytes(reply[: len(MAGIC)]), bytes(reply[len(MAGIC) : -TAG_BYTES]), reply[-TAG_BYTES:])
    if magic != MAGIC:
        raise LinkRefused("not an engine link's handshake")
    if not hmac.compare_digest(proof, _mac(key, b"engine", ours, theirs)):
        raise LinkRefused("wrong secret")
    sock.sendall(_mac(key, b"trainer", theirs, ours))
    sock.settimeout(None)
    return Connection(sock, _mac(key, b"session", ours, theirs), b"T", b"E")


def connect(sock: socket.socket, key: bytes, address: str) -> Connection:
    """The engine's side of the handshake with the trainer at `address` (for messages); LinkRefused when the
    trainer turns this secret away or does not prove it holds it; LinkUngreeted when it closes the connection or
    stays silent before its greeting."""
    deadline = time.monotonic() + HANDSHAKE_SECONDS
    try:
        hello = _read_exact(sock, len(MAGIC) + NONCE_BYTES, deadline)
    except OSError as exc:
        raise LinkUngreeted(f"the trainer at {address} did not greet this engine process ({exc})") from None
    if bytes(hello[: len(MAGIC)]) != MAGIC:
        raise LinkRefused(f"rollout.mode async: {address} is not a grpo_fast trainer's engine link")
    try:
        theirs, ours = bytes(hello[len(MAGIC) :]), secrets.token_bytes(NONCE_BYTES)
        sock.sendall(MAGIC + ours + _mac(key, b"engine", theirs, ours))
        proof = _read_exact(sock, TAG_BYTES, deadline)
    except OSError as exc:
        raise LinkRefused(
            f"rollout.mode async: the trainer at {address} refused this engine process ({exc}): its link secret is "
            f"not this one (use the trainer's: --secret-file with the file it logs, or ${SECRET_ENV} as set on its "
            "side)"
        ) from None
    if not hmac.compare_digest(proof, _mac(key, b"trainer", ours, theirs)):
        raise LinkRefused(f"rollout.mode async: {address} did not prove it holds the link secret: not this run's")
    sock.settimeout(None)
    return Connection(sock, _mac(key, b"session", theirs, ours), b"E", b"T")

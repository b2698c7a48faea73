"""The async engine link against a local attacker: a process of this host that knows the trainer's address (as any
process can, from the socket table) but not the run's secret. Each attack here worked against the link of a plain
TCPStore with pickled messages: the attacker read the run's setup, ran code in the trainer by queueing a pickle,
ended the run with a stop message, and took the engine's place. The listener binds loopback unless told otherwise,
checked in the kernel's socket table."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import pickle
import socket
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model, save_tiny
from grpo_fast.rollout.async_rollouts import AsyncOptions, AsyncRollouts, EngineSpec
from grpo_fast.rollout.base import SamplingSpec
from grpo_fast.rollout.partial import PartialOptions
from grpo_fast.rollout.weight_sync import trainer_weights

TOK = build_char_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(build_tiny_model(TOK, seed=5), TOK, tmp_path_factory.mktemp("link") / "secret_model_dir")


def _remote(model_dir, *, launch: str = "external", timeout: float = 60.0, address: str = "") -> AsyncRollouts:
    pool = dict(
        options=PartialOptions(segment_tokens=4, groups_in_flight=2.0),
        num_generations=2,
        max_completion_length=8,
        max_staleness=4,
        stale="restart",
    )
    return AsyncRollouts(
        AsyncOptions(threads=1, timeout_seconds=timeout, launch=launch, address=address),
        EngineSpec("hf", str(model_dir)),
        pool,
        SamplingSpec(n=1, temperature=1.0),
        0,
        trainer_weights(build_tiny_model(TOK, seed=5)),
        0,
    )


class _CreatesFile:
    """A pickle whose loading creates `path` (any code would do)."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _store_client(address: str) -> dist.TCPStore:
    """The attacker's way in to a TCPStore: torch's own client."""
    host, port = address.rsplit(":", 1)
    return dist.TCPStore(host, int(port), None, False, timeout=datetime.timedelta(seconds=5))


def _listening(pid: int) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """(address, port) of every TCP socket process `pid` listens on, from /proc/net/tcp and tcp6."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    out = []
    for table in ("tcp", "tcp6"):
        for line in open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            hex_address, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_address)  # 32-bit words in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            address = ipaddress.ip_address(raw)
            out.append((address, int(hex_port, 16)))
    return out


def _is_loopback(address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _assert_generates_a_group(remote: AsyncRollouts) -> None:
    """The engine starts and answers one prompt with one group: the run goes on."""
    remote.start()
    remote.send([(0, TOK("(1*7)%10=")["input_ids"])])
    groups, _, _ = remote.collect(1, version=0)
    assert len(groups) == 1


def test_the_link_listens_on_loopback_by_default(model_dir):
    """No address set: the trainer's link, and the weights' process group of the trainer and of its engine process,
    listen on loopback only (the kernel's socket table of both processes, for the sockets this test made)."""
    before = set(_listening(os.getpid()))
    remote = _remote(model_dir, launch="spawn")
    try:
        remote.start()  # the engine holds the weights: every socket of the link is open
        port = int(remote.address.rsplit(":", 1)[1])
        trainer = set(_listening(os.getpid())) - before
        engine = set(_listening(remote.processes[0].pid))
        assert port in {p for _, p in trainer}, (port, trainer)
        assert len(trainer) >= 2 and engine, "the link's and gloo's listeners"
        exposed = [(str(a), p) for a, p in trainer | engine if not _is_loopback(a)]
        assert not exposed, f"listening beyond loopback: {exposed}"
    finally:
        remote.close()


@pytest.mark.parametrize("named", ["", "127.0.0.2:0"])
def test_an_external_launch_listens_on_loopback_or_the_named_interface_only(model_dir, named):
    """launch external without an address listens on loopback; with one, on that interface alone (127.0.0.2 here,
    an address of the loopback interface that no default would pick)."""
    remote = _remote(model_dir, address=named)
    try:
        host, port = remote.address.rsplit(":", 1)
        assert host == (named.split(":")[0] or "127.0.0.1")
        (address,) = [a for a, p in _listening(os.getpid()) if p == int(port)]
        assert str(getattr(address, "ipv4_mapped", None) or address) == host
    finally:
        remote.close()


def test_an_outsider_can_neither_read_the_setup_nor_put_a_message(model_dir, tmp_path):
    """A local process without the secret, with torch's store client: it cannot read the run's setup (its model
    directory, tensor count, backend), queue a pickle that runs code in the trainer, poison the setup the engine
    loads, or send the engine stop. Then the run goes on: the engine starts and its groups come, and no pickle ran."""
    remote = _remote(model_dir, launch="spawn")
    marker = tmp_path / "code_ran"
    payload = pickle.dumps(_CreatesFile(marker))
    try:
        with pytest.raises(dist.DistError):
            _store_client(remote.address).get("setup")
        for key, attack in (("groups", "queue_push"), ("control/0", "queue_push"), ("setup", "set")):
            with pytest.raises(dist.DistError):
                getattr(_store_client(remote.address), attack)(key, payload)
        assert remote.take_ready(1, version=0) == ([], {})
        _assert_generates_a_group(remote)
    finally:
        remote.close()
    assert not marker.exists()


def test_an_engine_without_the_secret_is_refused_and_the_run_goes_on(model_dir, caplog):
    """A rogue `grpo-fast engine` that holds a wrong secret is turned away before it learns anything (it would get
    the weights and feed the trainer groups): it exits with an error saying so, the trainer logs the refused peer,
    and the real engine then starts and generates."""
    remote = _remote(model_dir, launch="spawn")
    env = {**os.environ, "GRPO_FAST_LINK_SECRET": "0" * 64}
    command = [sys.executable, "-m", "grpo_fast.cli", "engine", "--connect", remote.address, "--threads", "1"]
    try:
        with caplog.at_level(logging.WARNING, logger="grpo_fast.rollout.link_store"):
            rogue = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
            assert rogue.returncode != 0
            assert "refused" in rogue.stderr and "secret" in rogue.stderr, rogue.stderr[-2000:]
            assert str(model_dir) not in rogue.stderr + rogue.stdout
            deadline = time.monotonic() + 10
            while "refused" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
        assert "refused a connection from 127.0.0.1" in caplog.text
        _assert_generates_a_group(remote)
    finally:
        remote.close()


def test_a_stranger_on_the_port_learns_nothing(model_dir, caplog):
    """A raw connection that does not prove the secret: the trainer closes it within the handshake's deadline, and
    what it sent before holds nothing of the run (no model directory, no setup)."""
    remote = _remote(model_dir)
    host, port = remote.address.rsplit(":", 1)
    received = b""
    try:
        with caplog.at_level(logging.WARNING, logger="grpo_fast.rollout.link_store"):
            with socket.create_connection((host, int(port)), timeout=30) as conn:
                conn.sendall(os.urandom(80))  # as long as an engine's answer to the trainer's hello
                try:
                    while chunk := conn.recv(4096):  # until the trainer closes the connection
                        received += chunk
                except ConnectionResetError:  # closed with bytes of ours unread
                    pass
            deadline = time.monotonic() + 10
            while "refused" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
        assert "refused a connection from 127.0.0.1" in caplog.text
        assert len(received) <= 64, received
        assert str(model_dir).encode() not in received and b"setup" not in received
    finally:
        remote.close()

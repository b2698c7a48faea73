"""`grpo-fast engine`: bad arguments are an error naming the argument, before anything connects; a trainer that
never comes is an error after --connect-seconds, not a hang."""

from __future__ import annotations

import socket
import time

import pytest

from grpo_fast.cli import main


@pytest.mark.parametrize("address", ["node0", "node0:", ":29600", "node0:http", "node0:70000"])
def test_a_malformed_address_names_connect(address):
    with pytest.raises(SystemExit, match=rf"--connect: expected HOST:PORT .*got '{address}'"):
        main(["engine", "--connect", address])


def test_a_nonpositive_thread_count_names_threads():
    with pytest.raises(SystemExit, match="--threads: expected a positive count, got 0"):
        main(["engine", "--connect", "127.0.0.1:1", "--threads", "0"])


def test_no_trainer_listening_is_an_error_within_the_wait(monkeypatch):
    monkeypatch.setenv("GRPO_FAST_LINK_SECRET", "s" * 32)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=f"no trainer answered at 127.0.0.1:{port} in 1 s"):
        main(["engine", "--connect", f"127.0.0.1:{port}", "--connect-seconds", "1"])
    assert time.monotonic() - start < 30

"""The remote backend against a local stand-in of a SandboxFusion service (sandbox_fusion_stub.py, run as
its own process): same rewards as the local sandbox, retries, and loud failures when it is down."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_rewards_code import ADD, ADD_TESTS
from test_rewards_code_attacks import HONEST, LEAKY_SETUPS, THIEF

from grpo_fast.rewards import code_tests
from grpo_fast.rewards.code import ShellRunner
from grpo_fast.rewards.outcomes import ProgramFailure, VerifierStartupError

STUB = Path(__file__).with_name("sandbox_fusion_stub.py")
LIMITS = {"wall_s": 3.0, "memory_bytes": 1 << 30}


@pytest.fixture
def service(tmp_path):
    """start(*options) -> the URL of a new stand-in service (stopped after the test)."""
    started = []

    def start(*options: str) -> str:
        port_file = tmp_path / f"port-{len(started)}"
        started.append(subprocess.Popen([sys.executable, str(STUB), str(port_file), *options]))
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            assert time.monotonic() < deadline and started[-1].poll() is None, "the stand-in did not start"
            time.sleep(0.05)
        return f"http://127.0.0.1:{port_file.read_text()}"

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def remote(url: str, programs: list[str], tests: list, **options) -> list:
    sandbox = {"backend": "remote", "url": url, "timeout_s": 10.0, "retries": options.pop("retries", 3)}
    return code_tests(
        ["p"] * len(programs), programs, [tests] * len(programs), limits=LIMITS, sandbox=sandbox, **options
    )


def test_the_remote_backend_scores_as_the_local_sandbox_does(service):
    url = service()
    stack = "class Stack:\n    def __init__(self): self.items = []\n    def push(self, x): self.items.append(x)\n"
    stack += "    def pop(self): return self.items.pop()\n"
    stateful = ["s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2\nassert s.pop() == 1"]
    assert remote(url, [ADD, "def add(a, b):\n    return abs(a) + b\n"], ADD_TESTS) == [1.0, pytest.approx(2 / 3)]
    assert remote(url, [stack], stateful) == [1.0]
    for layout in ("tuple_assignment", "list_of_dicts"):
        assert remote(url, [HONEST, THIEF], LEAKY_SETUPS[layout]) == [1.0, 0.0]
    io = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}]
    assert remote(url, ["a, b = map(int, input().split())\nprint(a + b)\n", "print(3)"], io) == [1.0, 0.5]
    shell = remote(url, ["read a b\necho $((a + b))\n"], io, runner=ShellRunner())
    assert shell == [1.0]


def test_a_program_that_runs_out_of_time_remotely_fails_its_tests(service):
    url = service()
    slow = "import time\ndef add(a, b):\n    time.sleep(10)\n    return a + b\n"
    [reward] = remote(url, [slow], ADD_TESTS[:1])
    assert reward == 0.0 and isinstance(reward, ProgramFailure) and "timeout" in reward.reason


def test_failed_requests_are_retried(service):
    assert remote(service("--fail-first", "1"), [ADD], ADD_TESTS, retries=1) == [1.0]
    assert remote(service("--sandbox-error-first", "1"), [ADD], ADD_TESTS, retries=1) == [1.0]


def test_a_service_that_is_down_is_an_error_not_a_score(service):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(VerifierStartupError, match=r"(?s)remote sandbox .*Connection refused.*after 2 attempts"):
        remote(dead, [ADD], ADD_TESTS, retries=1)
    with pytest.raises(VerifierStartupError, match="HTTPError.*503"):
        remote(service("--fail-first", "100"), [ADD], ADD_TESTS, retries=1)

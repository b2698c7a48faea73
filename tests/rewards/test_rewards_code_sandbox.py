"""The code sandbox: refusal without a sandbox, the minimal /dev, and no process outliving a call."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

import pytest
from test_rewards_code import LIMITS, UNSANDBOXED, needs_namespaces, sandbox_processes, score

from grpo_fast.rewards import code_tests
from grpo_fast.rewards.checks import check_verifiers
from grpo_fast.rewards.code import ShellRunner
from grpo_fast.rewards.outcomes import VerifierStartupError
from grpo_fast.rewards.registry import reward_from_spec
from grpo_fast.rewards.routing import RoutedReward
from grpo_fast.sandbox import BACKENDS, isolation, run_sandboxed

isolation_module = sys.modules["grpo_fast.sandbox.isolation"]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runs programs as another uid)")

# escape(): a child that leaves the run's process group and session (with double=True: the grandchild of
# a double fork, orphaned at once), to sleep for a minute; returns its pid.
ESCAPE = """
import os, time
def escape(double):
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if double and os.fork() != 0:
            os._exit(0)
        os.write(write, b"%d " % os.getpid())
        time.sleep(60)
        os._exit(0)
    return os.read(read, 32).decode()
"""
ESCAPING = ESCAPE + "print(escape(False) + escape(True))\n"
ADD = "def add(a, b):\n    return a + b\n"


def _only(monkeypatch, level):
    """Pretend this machine allows only `level` (no namespaces, no bwrap)."""
    monkeypatch.setattr(isolation_module, "isolation", lambda: level)
    monkeypatch.setattr(isolation_module, "probe", lambda backend: "not on this machine (test)")


@pytest.mark.parametrize("level", ["uid", "rlimits"])
def test_refuses_to_run_without_a_sandbox(monkeypatch, level):
    _only(monkeypatch, level)
    options = r"(?s)namespaces: not on this machine.*bwrap: .*bubblewrap.*remote.*allow_unsandboxed=True"
    with pytest.raises(RuntimeError, match=options):
        code_tests(["p"], ["def add(a, b):\n    return a + b\n"], [["assert add(1, 2) == 3"]])
    with pytest.raises(RuntimeError, match=options):
        run_sandboxed({}, [{"argv": ["/bin/true"], "stdin": ""}])


@needs_root
def test_uid_level_opt_in_kills_every_process_of_the_sandbox_uid(monkeypatch):
    _only(monkeypatch, "uid")
    sleeper = "setsid sh -c 'sleep 60' </dev/null >/dev/null 2>&1 &"
    program = f"{sleeper}\n( {sleeper} )\necho done\n"
    tests = [{"input": "", "output": "done"}]
    reward = code_tests(["p"], [program], [tests], limits=LIMITS, runner=ShellRunner(), allow_unsandboxed=True)
    assert reward == [1.0]
    assert sandbox_processes() == []


def test_rlimits_level_opt_in_kills_processes_that_left_the_session(monkeypatch):
    _only(monkeypatch, "rlimits")
    run = {"argv": [sys.executable, "-I", "solution.py"], "stdin": ""}
    result = run_sandboxed({"solution.py": ESCAPING}, [run], LIMITS, allow_unsandboxed=True)[0]
    pids = [int(pid) for pid in result["stdout"].split()]
    assert len(pids) == 2
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)


@needs_namespaces
def test_setsid_does_not_escape_the_wall_clock_kill():
    """At load time, during probes, and in a plain run that overruns its wall clock."""
    start = time.monotonic()
    assert score(ESCAPING + ADD) == 1.0
    assert score(ESCAPE + "def add(a, b):\n    escape(False)\n    escape(True)\n    return a + b\n") == 1.0
    assert score(ESCAPING + "while True:\n    pass\n", [{"input": "", "output": "x"}]) == 0.0
    assert time.monotonic() - start < 20
    assert sandbox_processes() == []


@needs_namespaces
def test_dev_holds_only_what_python_needs():
    program = """
import os
print(sorted(os.listdir("/dev")), sorted(os.listdir("/dev/shm")))
with open("/dev/null", "w") as f:
    f.write("x")
with open("/dev/shm/mine", "w") as f:
    f.write("x")
print(len(os.urandom(8)), len(open("/dev/urandom", "rb").read(8)), open("/dev/zero", "rb").read(2))
try:
    with open("/dev/full", "w") as f:
        f.write("x")
except OSError as exc:
    print(exc.errno)
"""
    listing = ["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"]
    expected = f"{listing} []\n8 8 b'\\x00\\x00'\n28\n"
    assert score(program, [{"input": "", "output": expected}]) == 1.0
    assert not os.path.exists("/dev/shm/mine")


def test_a_runner_that_dies_is_replaced_and_one_that_never_loads_fails_every_test():
    program = "import os\ndef add(a, b):\n    if a == -1:\n        os._exit(0)\n    return a + b\n"
    assert score(program) == pytest.approx(2 / 3)  # add(-1, 1) kills its runner; add(10, 5) gets a new one
    assert score("raise SystemExit(0)\n" + program) == 0.0


def test_scoring_from_a_thread_that_ends_leaves_later_scoring_intact():
    """A sandbox dies with the thread that started it: nothing it leaves is reused by another thread."""
    rewards = []
    worker = threading.Thread(target=lambda: rewards.append(score(ADD)))
    worker.start()
    worker.join()
    assert rewards == [1.0]
    assert score(ADD) == 1.0


def test_start_up_checks_name_the_backend_and_stop_a_broken_verifier():
    spec = {"name": "code_tests", "limits": {"wall_s": 2.0}, "allow_unsandboxed": UNSANDBOXED}
    routed = RoutedReward(reward_from_spec(spec), {"kind": "code"})
    checked = check_verifiers([reward_from_spec(spec), routed, reward_from_spec("math_accuracy")])
    status = checked["code_tests"]
    assert list(checked) == ["code_tests"] and status.text.startswith(f"sandbox backend {isolation()}, ")
    whole = status.metrics.pop("sandbox/memory_per_sandbox") == 1.0  # a control group bounds each sandbox
    assert status.metrics == {f"sandbox/{isolation()}": 1.0} and status.unsafe == (not whole)
    assert ("bounded per sandbox" in status.text) == whole and (isolation() in BACKENDS or not whole)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    broken = reward_from_spec({"name": "code_tests", "sandbox": {"backend": "remote", "url": dead, "retries": 0}})
    with pytest.raises(VerifierStartupError, match="remote sandbox .*Connection refused"):
        check_verifiers([broken])


def test_a_call_that_hangs_fails_its_test_only_and_a_load_that_hangs_fails_them_all_at_once():
    hangs_on_one = "def add(a, b):\n    while a == 1:\n        pass\n    return a + b\n"
    tests = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]
    assert score(hangs_on_one, tests) == pytest.approx(2 / 3)
    start = time.monotonic()
    assert score("while True:\n    pass\n" + ADD, tests) == 0.0
    assert time.monotonic() - start < 2 * LIMITS.wall_s + 3  # one load's time, not one per test

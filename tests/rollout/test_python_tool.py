"""PythonEnvironment: a persistent interpreter as a TRL environment tool, in the real sandbox (no mocks).

Everything but the schema and the refusals runs code in the strongest local backend (namespaces as root,
bwrap otherwise) and checks the outcome from the host: what the model reads, the host's files, a host
socket, the sandbox's processes.
"""

from __future__ import annotations

import gc
import inspect
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid

import pytest
from transformers.utils import get_json_schema

from grpo_fast.rewards.outcomes import InfrastructureError
from grpo_fast.rollout.python_tool import PythonEnvironment, ToolCallFailed
from grpo_fast.sandbox import isolation, probe
from grpo_fast.testing import processes

sandboxed = pytest.mark.skipif(
    isolation() not in ("namespaces", "bwrap"),
    reason="no local sandbox backend here (namespaces needs root and unshare; bwrap needs bubblewrap)",
)
LIMITS = {"wall_s": 1.0, "memory_bytes": 1 << 30}


@pytest.fixture
def env():
    environment = PythonEnvironment(limits=LIMITS)
    yield environment
    environment.close()


def test_the_one_tool_and_its_schema():
    tools = [
        name
        for name, _ in inspect.getmembers(PythonEnvironment, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    ]
    assert tools == ["python"]  # as TRL lists them: close is no tool
    schema = get_json_schema(PythonEnvironment().python)["function"]
    assert schema["name"] == "python" and "persistent" in schema["description"]
    assert schema["parameters"]["properties"]["code"]["type"] == "string"
    assert schema["parameters"]["properties"]["code"]["description"]
    assert schema["parameters"]["required"] == ["code"]


def test_refusals():
    with pytest.raises(ValueError, match="local sandbox"):
        PythonEnvironment(sandbox={"backend": "remote", "url": "http://127.0.0.1:9"})
    with pytest.raises(ValueError, match="max_output_chars"):
        PythonEnvironment(limits={"output_bytes": 1 << 16}, max_output_chars=4000)


@sandboxed
def test_a_sandbox_that_cannot_start_is_an_infrastructure_error():
    environment = PythonEnvironment(python="/bin/false")  # the launcher itself exits at once
    with pytest.raises(InfrastructureError, match="could not be set up"):
        environment.python("1")


@sandboxed
def test_a_sandbox_lost_during_a_call_fails_that_call_and_the_next_runs_in_a_fresh_one(env):
    env.python("import time")
    os.kill(env._interpreter.session.proc.pid, signal.SIGKILL)
    with pytest.raises(ToolCallFailed, match="the sandbox failed .*the next call runs in a fresh sandbox"):
        env.python("time.sleep(0.2)")
    assert env.python("6 * 7") == "42\n"  # in a new sandbox


@sandboxed
def test_variables_persist_within_a_rollout_and_reset_clears_them(env):
    assert env.reset(prompt="unused") is None
    assert env.python("x = 41\nprint('set')") == "set\n"
    assert env.python("x + 1") == "42\n"
    env.reset()
    assert "NameError: name 'x' is not defined" in env.python("x")


@sandboxed
def test_an_exception_is_an_error_text_and_the_interpreter_lives_on(env):
    env.python("a = 1")
    answer = env.python("print('before')\n{}['missing']")
    assert answer.startswith("before\n") and "Traceback" in answer and "KeyError: 'missing'" in answer
    assert "SyntaxError" in env.python("def (")
    assert env.python("a") == "1\n"


@sandboxed
def test_a_call_past_the_time_limit_restarts_the_interpreter(env):
    env.python("a = 1")
    start = time.monotonic()
    with pytest.raises(ToolCallFailed, match="^timed out after 1 s; the interpreter was restarted, its variables"):
        env.python("while True:\n    pass")
    assert time.monotonic() - start < 5
    assert "NameError" in env.python("a")
    assert env.python("6 * 7") == "42\n"


@sandboxed
def test_an_interpreter_that_dies_is_restarted():
    environment = PythonEnvironment(limits={**LIMITS, "wall_s": 30.0, "cpu_s": 1})  # cpu_s first, even when loaded
    try:
        lost = "; the interpreter was restarted, its variables are lost"
        with pytest.raises(ToolCallFailed) as exited:
            environment.python("import os\nos._exit(3)")
        assert str(exited.value) == f"the interpreter exited with status 3{lost}"
        with pytest.raises(ToolCallFailed) as killed:
            environment.python("while True:\n    pass")  # past cpu_s: SIGKILL with soft = hard limit
        assert str(killed.value).startswith("the interpreter exited: ") and str(killed.value).endswith(lost)
        assert environment.python("6 * 7") == "42\n"
    finally:
        environment.close()


@pytest.fixture
def host_dir():
    """A directory on the host that anyone may read and write: only the sandbox keeps the code out."""
    path = tempfile.mkdtemp()
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path)


@sandboxed
def test_the_code_cannot_reach_the_hosts_files_or_network(env, host_dir):
    secret = os.path.join(host_dir, "secret.txt")
    with open(secret, "w") as f:
        f.write(f"SECRET-{uuid.uuid4().hex}")
    os.chmod(secret, 0o644)
    targets = [os.path.join(host_dir, "escape.txt"), f"/dev/shm/escape-{uuid.uuid4().hex}"]
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    code = f"""
import socket
for path in {targets!r}:
    try:
        open(path, 'w').write('x')
    except OSError:
        pass
try:
    print(open({secret!r}).read())
except OSError as exc:
    print(type(exc).__name__)
try:
    socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=1).sendall(b'leak')
except OSError:
    print('no network')
open('inside.txt', 'w').write('ok')
print(open('inside.txt').read())
"""
    try:
        assert env.python(code) == "FileNotFoundError\nno network\nok\n"
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
    assert not any(os.path.exists(target) for target in targets)


@sandboxed
def test_calls_from_threads_that_end_before_the_rollout_does(env):
    """A launcher dies with the thread that started it: the first call's thread is gone before the second."""
    answers = []
    for code in ("x = 41", "x + 1"):
        thread = threading.Thread(target=lambda code=code: answers.append(env.python(code)))
        thread.start()
        thread.join()
        time.sleep(0.1)  # time for a parent-death signal to land
    assert answers == ["", "42\n"]


def _process_tree(pid: int) -> set[int]:
    """`pid` and every process descended from it."""
    parents = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                parents[int(entry)] = int(f.read().rpartition(b")")[2].split()[1])
        except (OSError, ValueError):
            continue
    tree = {pid}
    while grown := {child for child, parent in parents.items() if parent in tree} - tree:
        tree |= grown
    return tree


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except OSError:
        return False


def _sandbox_tree(environment: PythonEnvironment) -> set[int]:
    environment.python("1")
    tree = _process_tree(environment._interpreter.session.proc.pid)
    assert len(tree) >= 3  # the launcher, (the sandbox's first process,) the interpreter
    return tree


def _all_gone(pids: set[int]) -> bool:
    deadline = time.monotonic() + 5
    while any(map(_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not any(map(_running, pids))


@sandboxed
def test_close_and_garbage_collection_stop_the_sandbox():
    closed = PythonEnvironment(limits=LIMITS)
    tree = _sandbox_tree(closed)
    closed.close()
    assert _all_gone(tree)
    with pytest.raises(RuntimeError, match="closed"):
        closed.python("1")
    collected = PythonEnvironment(limits=LIMITS)
    tree = _sandbox_tree(collected)
    del collected
    gc.collect()
    assert _all_gone(tree)


SHM_FLOOD = """
import ctypes, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
segments = 0
for _ in range(38):  # System V segments, filled and detached: in no process's address space
    sid = libc.shmget(0, 8 << 20, 0o1000 | 0o600)
    addr = libc.shmat(sid, None, 0) if sid >= 0 else None
    if addr in (None, ctypes.c_void_p(-1).value):
        break
    ctypes.memset(addr, 1, 8 << 20)
    libc.shmdt(ctypes.c_void_p(addr))
    segments += 1
blocks = 0
try:
    for i in range(38):  # POSIX shared memory, written, until the sandbox has no more
        with open(f"/dev/shm/block{i}", "wb") as f:
            f.write(b"x" * (8 << 20))
        blocks += 1
except OSError:
    pass
print(segments, blocks)
"""
KILLS = "import os\nfor pid in (-1, 1):\n    try:\n        os.kill(pid, 9)\n    except OSError:\n        pass"
LOCAL = [level for level in ("namespaces", "bwrap") if probe(level) is None]


@pytest.mark.parametrize("level", LOCAL or [pytest.param(None, marks=pytest.mark.skip("no local sandbox"))])
def test_code_that_breaks_its_own_sandbox_fails_its_call_never_the_run(level):
    """Shared memory filling the sandbox (then memory for the interpreter), every process signalled, the launcher
    signalled: each call either answers or fails as the model's failure (ToolCallFailed); the next call works; no
    call is an InfrastructureError."""
    environment = PythonEnvironment(sandbox=level, limits={"wall_s": 10.0, "memory_bytes": 256 << 20})
    try:
        for code in [SHM_FLOOD, "x = bytearray(100 << 20); 1", "1"] * 3 + [KILLS, "import os\nos.kill(os.getpid(), 9)"]:
            try:
                environment.python(code)
            except ToolCallFailed:
                pass
            assert environment.python("6 * 7") == "42\n"
    finally:
        environment.close()


@sandboxed
def test_nothing_of_a_call_runs_after_it(env):
    """Detached daemons, a chain of CPU spinners and a spinning thread started by a call: once it returns only the
    interpreter is left, stopped, and the sandbox spends no CPU time; its shared memory is gone."""
    code = """
import os, threading, time
def spin():
    while True:
        pass
for _ in range(3):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            spin()
        os._exit(0)
threading.Thread(target=spin, daemon=True).start()
open("/dev/shm/kept", "wb").write(b"x" * (1 << 20))
print("started")
"""
    assert env.python(code) == "started\n"
    launcher = env._interpreter.session.proc.pid
    left = {pid: info for pid, info in processes.sandbox_of(launcher).items() if info.namespace_pid != 1}
    assert len(left) == 1 and next(iter(left.values())).state in ("T", "t")
    before = processes.sandbox_cpu_s(launcher)
    time.sleep(1.0)
    assert processes.sandbox_cpu_s(launcher) - before < 0.05
    assert env.python("import os\nos.listdir('/dev/shm')") == "[]\n"


@sandboxed
def test_a_reset_does_not_wait_for_an_abandoned_call(env):
    env.python("1")
    caller = threading.Thread(target=lambda: pytest.raises(ToolCallFailed, env.python, "while True:\n    pass"))
    caller.start()
    time.sleep(0.5)  # the call runs; its caller gives up on it (a tool loop's timeout) and the next rollout starts
    start = time.monotonic()
    env.reset()
    assert time.monotonic() - start < 0.5
    caller.join(10)
    assert not caller.is_alive() and env.python("6 * 7") == "42\n"

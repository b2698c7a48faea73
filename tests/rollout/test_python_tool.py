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
from grpo_fast.rollout.python_tool import PythonEnvironment
from grpo_fast.sandbox import isolation

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
def test_a_sandbox_that_dies_during_a_call_is_an_infrastructure_error(env):
    env.python("import time")
    os.kill(env._interpreter.session.proc.pid, signal.SIGKILL)
    with pytest.raises(InfrastructureError, match="failed during a call"):
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
    assert env.python("while True:\n    pass") == (
        "error: timed out after 1 s; the interpreter was restarted, its variables are lost"
    )
    assert time.monotonic() - start < 5
    assert "NameError" in env.python("a")
    assert env.python("6 * 7") == "42\n"


@sandboxed
def test_an_interpreter_that_dies_is_restarted():
    environment = PythonEnvironment(limits={**LIMITS, "wall_s": 3.0, "cpu_s": 1})
    try:
        lost = "; the interpreter was restarted, its variables are lost"
        assert environment.python("import os\nos._exit(3)") == f"error: the interpreter exited with status 3{lost}"
        killed = environment.python("while True:\n    pass")  # past cpu_s: SIGKILL with soft = hard limit
        assert killed.startswith("error: the interpreter exited: ") and killed.endswith(lost)
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

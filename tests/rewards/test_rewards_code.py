"""Code rewards: correct and wrong programs, and hostile programs contained by the sandbox.

Hostile cases assert real outcomes on the host (files not created, connections not accepted, this
process and the launcher alive, no sandbox process left), each within a time bound.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

import pytest

from grpo_fast.rewards import code_tests
from grpo_fast.rewards.code import ShellRunner, extract_code
from grpo_fast.rewards.code.cases import parse_assert, parse_cases
from grpo_fast.rewards.code.programs import close_idle
from grpo_fast.sandbox import SandboxLimits, isolation
from grpo_fast.testing import processes

processes.adopt_orphans()  # a process that detaches itself from a sandbox stays this process's descendant
LIMITS = SandboxLimits(wall_s=2.0, memory_bytes=1 << 30)
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]
ADD = "def add(a, b):\n    return a + b\n"
needs_namespaces = pytest.mark.skipif(isolation() != "namespaces", reason="needs root and unshare")
needs_uid = pytest.mark.skipif(isolation() == "rlimits", reason="needs root (runs programs as another uid)")
# Without namespaces (not root, or unshare refused) these tests run their (benign) programs unsandboxed, by choice.
UNSANDBOXED = isolation() != "namespaces"


def score(program: str, tests=ADD_TESTS, **kw) -> float | None:
    return code_tests(["p"], [program], [tests], limits=LIMITS, allow_unsandboxed=UNSANDBOXED, **kw)[0]


def sandbox_processes() -> list[int]:
    """PIDs of the processes that a sandbox of this test process left behind (the idle judges and sandboxes set
    up ahead are stopped first); other programs' sandboxes on the host are not this test's to see."""
    close_idle()
    return processes.sandbox_processes()


def test_correct_and_wrong_programs():
    assert score(f"Here you go:\n```python\n{ADD}```") == 1.0
    assert score("def add(a, b):\n    return abs(a) + b\n") == pytest.approx(2 / 3)
    assert score("def add(a, b):\n    raise ValueError\n") == 0.0
    assert score("def add(a, b) return a") == 0.0
    assert score("no code at all ``` ```") == 0.0


def test_setup_statements_and_non_literal_expectations():
    program = (
        "class Stack(list):\n    push = list.append\n\ndef evens(n):\n    return [i for i in range(n) if i % 2 == 0]\n"
    )
    tests = [
        "s = Stack()\ns.push(3)\nassert s.pop() == 3",
        "assert evens(5) == list(range(0, 5, 2))",
        "assert len(evens(4)) == len(range(0, 4, 2))",
        "assert all(x % 2 == 0 for x in evens(9))",
        "assert evens(3) == [0]",
    ]
    assert score(program, tests) == pytest.approx(4 / 5)


def test_stdin_stdout_tests_and_json_string_column():
    program = "a, b = map(int, input().split())\nprint(a + b)\n"
    tests = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5", "output": "10"}, {"input": "0 0", "output": "1"}]
    assert score(program, tests) == pytest.approx(2 / 3)
    assert score(program, json.dumps({"inputs": ["2 2"], "outputs": ["4"]})) == 1.0


def test_pluggable_runner():
    tests = [{"input": "hello\n", "output": "HELLO"}, {"input": "x\n", "output": "y"}]
    assert score('read line\necho "$line" | tr a-z A-Z\n', tests, runner=ShellRunner()) == 0.5


def test_cases_parsing():
    case = parse_assert("x = 2\nassert f(x) == [1, 2]")
    assert (case.program, case.known, case.prelude, case.problem) == (("f",), (), "", None)
    assert parse_assert("def g(x):\n    return h(x)\nassert f(1) == g(2)").program == ("f", "h")
    case = parse_assert("import numpy as np\nnp.random.seed(0)\nrandom.seed(1)\nassert Counter(f(1)) == {1: 2}")
    assert case.program == ("f",) and dict(case.known) == {"Counter": "collections:Counter", "random": "random"}
    assert case.prelude == "import numpy as np\nnp.random.seed(0)"  # random is not imported by the test
    assert parse_assert("assert eval(f(1)) == 2").problem == "it uses eval"
    with pytest.raises(ValueError, match="tests"):
        parse_cases(["x = 1"])
    with pytest.raises(ValueError, match="tests"):
        parse_cases(["assert f(1) =="])
    with pytest.raises(ValueError, match="tests"):
        parse_cases([{"input": "1"}])


def test_extract_code_prefers_last_python_block():
    text = "```python\nold\n```\n```bash\nls\n```\n```py\nnew\n```"
    assert extract_code(text) == "new\n"
    assert extract_code("```\ngeneric\n```") == "generic\n"


def test_empty_tests_are_skipped():
    assert score(ADD, []) is None


# ---- hostile programs: each contained, reward 0 unless stated, host unharmed ----


def _contained(program: str, tests=ADD_TESTS, bound_s: float = 8.0) -> float | None:
    start = time.monotonic()
    reward = score(program, tests)
    assert time.monotonic() - start < bound_s
    assert sandbox_processes() == []
    return reward


def test_infinite_loop():
    assert _contained("while True:\n    pass\n" + ADD) == 0.0
    assert _contained("def add(a, b):\n    while True:\n        pass\n", ADD_TESTS[:1]) == 0.0


@needs_uid
def test_fork_bomb():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert _contained(bomb + ADD) == 0.0


def test_memory_hog():
    assert _contained("x = bytearray(8 << 30)\n" + ADD) == 0.0
    assert _contained("x = []\nwhile True:\n    x.append(' ' * 10**7)\n" + ADD) == 0.0


def test_huge_output():
    assert _contained("while True:\n    print('x' * 100000)\n" + ADD) == 0.0
    flood = [{"input": "", "output": "x"}]
    assert _contained("while True:\n    print('x' * 100000)\n", flood) == 0.0


@needs_namespaces
def test_writes_outside_the_workdir_do_not_land(tmp_path):
    tmp_path.chmod(0o777)  # world-writable: only the sandbox can stop the write
    targets = [tmp_path / "escape.txt", f"/tmp/escape-{uuid.uuid4().hex}", f"/dev/shm/escape-{uuid.uuid4().hex}"]
    program = "for p in %r:\n    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\n" % [
        str(t) for t in targets
    ]
    assert _contained(program + "open('inside.txt', 'w').write('ok')\n" + ADD) == 1.0
    assert not any(os.path.exists(t) for t in targets)


@needs_namespaces
def test_hidden_tests_are_not_readable(tmp_path):
    secret = f"SECRET-{uuid.uuid4().hex}"
    tests_file = tmp_path / "tests.json"
    tests_file.write_text(json.dumps([f"assert answer() == {secret!r}"]))
    tests_file.chmod(0o644)
    tmp_path.chmod(0o755)
    program = f"""
import glob, re
found = ''
for path in [{str(tests_file)!r}] + glob.glob('/proc/*/cmdline') + glob.glob('/proc/*/environ'):
    try:
        m = re.search('SECRET-[0-9a-f]+', open(path, errors='ignore').read())
    except OSError:
        continue
    if m:
        found = m.group(0)
        break
def answer():
    return found
"""
    assert _contained(program, json.loads(tests_file.read_text())) == 0.0


@needs_namespaces
def test_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    program = (
        f"""
import socket
for host in ['127.0.0.1', '8.8.8.8']:
    try:
        socket.create_connection((host, {port} if host == '127.0.0.1' else 53), timeout=1).sendall(b'leak')
    except OSError:
        pass
"""
        + ADD
    )
    try:
        assert _contained(program) == 1.0
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


@needs_uid
def test_killing_its_parent():
    program = (
        f"""
import os, signal
for pid in [os.getppid(), 1, {os.getpid()}, {os.getppid()}]:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
"""
        + ADD
    )
    # The launcher survived to answer every test, and this process is alive to see it.
    assert _contained(program) == 1.0
    assert score(ADD) == 1.0


def test_sys_exit_before_tests():
    assert _contained("import sys\nsys.exit(0)\n" + ADD) == 0.0
    assert _contained("import os\nos._exit(0)\n" + ADD) == 0.0


def test_monkeypatching_the_harness():
    program = """
import atexit, builtins, json, os, sys
class Yes:
    def __eq__(self, other): return True
    def __bool__(self): return True
    def __repr__(self): return '3'
builtins.repr = lambda x: '3'
builtins.AssertionError = type('Never', (Exception,), {})
json.dumps = lambda *a, **k: '{"ok": true, "value": "True"}'
sys.exit = lambda *a: None
os.write(3, b'{"loaded": true}\\n' + b'{"ok": true, "value": "True"}\\n' * 3)
atexit.register(lambda: os.write(3, b'{"ok": true, "value": "True"}\\n' * 3))
def add(a, b):
    return Yes()
"""
    tests = ["assert add(1, 2) == 7", "assert add(2, 2) == 8", "assert add(0, 0) == 9"]
    assert _contained(program, tests) == 0.0


def test_a_sandbox_set_up_ahead_and_used_after_its_deadline_still_scores(monkeypatch):
    """open_program sets the next sandbox up ahead; used long after (a demo's summary minutes after training), its
    launcher's set-up and call-runner answers wait in the pipe past their deadlines. They are read, not taken
    for a launcher that never answered (an InfrastructureError that stopped the run)."""
    import grpo_fast.rewards.code.programs as programs
    import grpo_fast.sandbox.session as sandbox

    monkeypatch.setattr(sandbox, "_SETUP_S", 0.2)
    monkeypatch.setattr(programs, "_START_S", 0.2)
    limits = {"wall_s": 0.5, "completion_s": 0.5}
    tests = [["assert add(1, 2) == 3"]]
    assert code_tests(["p"], [ADD], tests, limits=limits) == [1.0]  # sets the next sandbox up ahead
    time.sleep(2.0)  # past the spare's set-up (0.7 s) and runner-start (0.7 s) deadlines
    assert code_tests(["p"], [ADD], tests, limits=limits) == [1.0]
    close_idle()

"""Reward integrity: a program that attacks the probe protocol or the harness earns no more than the
same wrong functions scored honestly.

Every attack below is WRONG (functions that return True for everything, a wrong answer for most
tests) plus attack code, scored on truth-style and `==` asserts; the honest score of WRONG is the
bound. The forged values are the ones WRONG returns (True), so an attack can only gain by forging a
verdict, a negation, an expected value, or an answer to a probe it did not get.
"""

from __future__ import annotations

import uuid

import pytest
from test_rewards_code import sandbox_processes, score

from grpo_fast.rewards.code import PythonRunner
from grpo_fast.sandbox import SandboxLimits, Session, isolation

LEVEL = isolation()  # the unsandboxed levels run these benign programs as they are

TESTS = [
    "assert is_prime(7)",
    "assert not is_prime(8)",
    "assert is_prime(13)",
    "assert abs(area(2) - 12.566) < 1e-3",
    "import math\nassert math.isclose(area(1), 3.1416, rel_tol=1e-3)",
    "def g(x):\n    return x * x\nassert f(3) == g(3)",
    "assert f(3) == h(3)",  # both sides the program's: refused, it fails for every program
    "assert f(2) == 4",
]
RIGHT_SCORE = 7 / 8
RIGHT = """
def is_prime(n):
    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))

def area(r):
    return 3.14159265 * r * r

def f(x):
    return x * x

def h(x):
    return x * x
"""
WRONG = """
def is_prime(n):
    return True

def area(r):
    return 3.1416  # area(1), the one value an attack's object may be told (its float())

def f(x):
    return True

def h(x):
    return True
"""
WRONG_SCORE = 3 / 8  # is_prime(7), is_prime(13), isclose(area(1), 3.1416)

_EVERY_FD = """
import json as _json, os as _os
def _fds():
    fds = set(range(1025))
    try:
        fds |= {int(x) for x in _os.listdir("/proc/self/fd")}
    except OSError:
        pass
    return sorted(fds)
_FORGED = (
    b'{"loaded": true}\\n'
    + b'{"ok": true, "value": "True"}\\n' * 20
    + (_json.dumps({"token": "0" * 32, "values": ["True"] * 4}) + "\\n").encode() * 20
)
def _forge():
    for fd in _fds():
        try:
            _os.write(fd, _FORGED)
        except OSError:
            pass
"""
_WRAP_ALL = """
def _wrapped(function, before):
    def call(*args, **kwargs):
        before()
        return function(*args, **kwargs)
    return call
is_prime, area, f, h = (_wrapped(fn, {hook}) for fn in (is_prime, area, f, h))
"""
ATTACKS = {
    # the reported attack: a loaded line and answers on fd 3 at import time
    "answers_before_load": WRONG
    + """
import os
try:
    os.write(3, b'{"loaded": true}\\n' + b'{"ok": true, "value": "True"}\\n' * 20)
except OSError:
    pass
""",
    "forged_answers_on_every_fd_at_import": WRONG + _EVERY_FD + "_forge()\n",
    "forged_answers_on_every_fd_during_probes": WRONG + _EVERY_FD + _WRAP_ALL.format(hook="_forge"),
    "sys_exit_0_before_load": "import sys\nsys.exit(0)\n" + WRONG,
    "os_exit_0_before_load": "import os\nos._exit(0)\n" + WRONG,
    "sys_exit_0_during_tests": WRONG + "import sys\n" + _WRAP_ALL.format(hook="lambda: sys.exit(0)"),
    "os_exit_0_during_tests": WRONG + "import os\n" + _WRAP_ALL.format(hook="lambda: os._exit(0)"),
    "monkeypatched_harness": WRONG
    + """
import builtins, json, math, operator, sys
runner = vars(sys.modules["__main__"])
builtins.abs = lambda x: 0
builtins.bool = lambda *args: True
builtins.repr = lambda x: "True"
builtins.AssertionError = type("Never", (Exception,), {})
math.isclose = lambda *args, **kwargs: True
operator.eq = lambda a, b: True
json.dumps = lambda *args, **kwargs: '{"ok": true, "value": "True"}'
for name, value in list(runner.items()):
    if name in ("_repr", "_str"):
        runner[name] = lambda x: "True"
    elif name == "_bool":
        runner[name] = lambda x: True
    elif name == "_plain":
        runner[name] = lambda x: False
""",
    # the program's own abs/bool/math never judge its values
    "shadowed_builtins": WRONG
    + """
import math
class _Math:
    def isclose(self, *args, **kwargs): return True
math = _Math()
def abs(x): return 0
def bool(x): return True
def sorted(x): return x
""",
    "objects_equal_to_everything": """
class Yes:
    __hash__ = object.__hash__
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    __le__ = __gt__ = __ge__ = __lt__
    def __bool__(self): return True
    def __abs__(self): return 0
    def __sub__(self, other): return self
    __rsub__ = __add__ = __radd__ = __sub__
    def __float__(self): return 3.1416
    def __repr__(self): return "True"

def is_prime(n): return Yes()
def area(r): return Yes()
def f(x): return Yes()
def h(x): return Yes()
""",
    "frame_and_gc_inspection": WRONG
    + """
import gc, json, os, sys
def _answer_for_the_runner():
    probe = channel = None
    frame = sys._getframe(1)
    while frame is not None:
        for value in frame.f_locals.values():
            if isinstance(value, dict) and ("steps" in value or "expr" in value):
                probe = value
        frame = frame.f_back
    for obj in gc.get_objects():
        if type(obj).__name__ == "_Channel":
            channel = obj.fd
    if probe is None:
        return
    if "token" in probe:
        count = sum(len(step["items"]) for step in probe["steps"])
        line, fd = {"token": probe["token"], "values": ["True"] * count}, channel
    else:
        line, fd = {"ok": True, "value": "True"}, 3
    os.write(fd, (json.dumps(line) + "\\n").encode())
    os._exit(0)
"""
    + _WRAP_ALL.format(hook="_answer_for_the_runner"),
    "settrace_rewrites_answers": WRONG
    + """
import sys
def _tracer(frame, event, arg):
    if event == "call" and frame.f_code.co_name in ("send", "_send"):
        message = frame.f_locals.get("message")
        if isinstance(message, dict) and "values" in message:
            message["values"] = ["True"] * len(message["values"])
        elif isinstance(message, dict) and "loaded" not in message:
            message.update(ok=True, value="True")
            message.pop("error", None)
    return None
sys.settrace(_tracer)
""",
    "audithook_sniffs_expected_values": """
import re, sys
_sources = []
sys.addaudithook(lambda event, args: event == "compile" and _sources.append(args[0]))
def _source():
    text = _sources[-1] if _sources else ""
    return text.decode() if isinstance(text, bytes) else str(text)
def is_prime(n):
    return "not" not in _source()
def area(r):
    found = re.findall(r"- ([0-9.]+)|isclose\\(area\\(1\\), ([0-9.]+)", _source())
    return float(next(x for x in found[0] if x)) if found else True
def f(x):
    source = _source()
    if "g(" in source and "g" in globals():
        return globals()["g"](x)
    found = re.search(r"== ([0-9]+)", source)
    return int(found.group(1)) if found else True
def h(x):
    return True
""",
}


def test_right_and_wrong_functions():
    assert score(RIGHT, TESTS) == pytest.approx(RIGHT_SCORE)
    assert score(WRONG, TESTS) == pytest.approx(WRONG_SCORE)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_attack_earns_no_more_than_its_wrong_functions(attack):
    assert score(ATTACKS[attack], TESTS) <= WRONG_SCORE + 1e-9
    assert sandbox_processes() == []


def test_eq_always_true_cannot_pass_equality_with_a_literal():
    program = "class Yes:\n    def __eq__(self, other):\n        return True\n\n    __hash__ = None\n\n"
    program += "def f(x):\n    return Yes()\n"
    assert score(program, ["assert f(2) == 4", "assert 4 == f(2)", "assert f(1) in [3]", "assert f(3) == f(4)"]) == 0.0


def test_a_lying_repr_is_read_as_data_never_run(tmp_path):
    marker = tmp_path / "ran"
    program = f"""
class Lie:
    def __init__(self, text): self.text = text
    def __repr__(self): return self.text
def f(x):
    return Lie({f"__import__('os').system('touch {marker}')"!r})
def big(x):
    return Lie("1" + "0" * 100000)
def deep(x):
    return Lie("[" * 100000 + "]" * 100000)
"""
    tests = ["assert f(1) == 0", "assert not f(1)", "assert big(1) > 0", "assert deep(1) == []"]
    assert score(program, tests) == 0.0
    assert not marker.exists()


def test_expected_stdout_cannot_be_found():
    """stdin/stdout tests: the expected output is nowhere the program can look."""
    secret = f"OUT-{uuid.uuid4().hex}"
    hunter = r"""
import glob, os, re
pattern = re.compile(r"OUT-[0-9a-f]{32}")
texts = [" ".join(os.environ.values()), open(0, errors="ignore").read()]
paths = glob.glob("/proc/*/cmdline") + glob.glob("/proc/*/environ") + glob.glob("/proc/*/fd/*")
for root in ("/sandbox", "/tmp", "/dev/shm", "/proc/self/cwd"):
    for base, _, files in os.walk(root):
        paths += [os.path.join(base, name) for name in files]
for path in paths:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        texts.append(os.read(fd, 1 << 20).decode("utf-8", "ignore"))
        os.close(fd)
    except Exception:
        pass
for fd in range(3, 1025):
    try:
        os.set_blocking(fd, False)
        texts.append(os.read(fd, 1 << 20).decode("utf-8", "ignore"))
    except Exception:
        pass
found = [m for text in texts for m in pattern.findall(text)]
print(found[0] if found else "nothing")
"""
    tests = [{"input": f"IN-{uuid.uuid4().hex}\n", "output": secret}, {"input": "x\n", "output": secret}]
    assert score("print('nothing')", tests) == 0.0
    assert score(hunter, tests) == 0.0


# ---- the protocol itself, with a hand-written runner ----

_FAKE_RUNNER = """
import os, sys
fd = int(os.read(0, 64))
mode = sys.argv[1]
os.write(fd, b'{"hello": true}\\n' + (b"early\\n" if mode == "early" else b""))
buffer = b""
while True:
    while b"\\n" not in buffer:
        chunk = os.read(fd, 65536)
        if not chunk:
            sys.exit(0)
        buffer += chunk
    line, _, buffer = buffer.partition(b"\\n")
    if mode == "exit":
        os._exit(0)
    if mode != "silent":
        answer = b"x" * (2 * 2**20) if mode == "huge" else line
        os.write(fd, (answer + b"\\n") * (2 if mode == "twice" else 1))
"""


@pytest.mark.parametrize(
    ("mode", "answers"),
    [
        ("honest", ["request 0", "request 1", "request 2"]),
        ("twice", ["request 0", "the server wrote before it was asked", "request 2"]),
        ("early", ["the server wrote before it was asked"] * 3),
        ("silent", ["no answer: timeout"] * 3),
        ("exit", ["no answer: the runner exited"] * 3),
        ("huge", ["answer too large"] * 3),
    ],
)
def test_a_server_is_answered_only_in_turn_and_replaced_after_any_failure(mode, answers):
    """One answer line per request, written after it, within the time and size limits; anything else
    is an error and the server is killed (the next request starts a new one)."""
    python = PythonRunner().python
    got, serving = [], False
    with Session(LEVEL, SandboxLimits(wall_s=1.0, output_bytes=1 << 20), python, {}) as session:
        for i in range(3):
            if not serving:
                started = session.request({"op": "start", "argv": [python, "-I", "-c", _FAKE_RUNNER, mode]}, 30.0)
                assert started == {"started": True}
            answer = session.request({"op": "ask", "line": f"request {i}"}, 1.0)
            serving = "reply" in answer
            got.append(answer.get("reply", answer.get("error")))
    assert got == answers


def test_probe_channel_is_not_a_fixed_fd():
    """The channel is a socket at a random fd, announced on stdin: fds 3 and 4 are not it."""
    program = """
import os, stat
fds, sockets = [], []
for fd in range(1024):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        continue
    fds.append(fd)
    if stat.S_ISSOCK(mode):
        sockets.append(fd)
def channel():
    return [fds, sockets]
"""
    tests = ["assert len(channel()[1]) == 1", "assert channel()[1][0] >= 10", "assert 3 not in channel()[0]"]
    assert score(program, tests) == 1.0

"""An attack suite for the code sandbox: what a program (a completion's, or a Python-tool call's code) controls,
turned against the sandbox's claims (grpo_fast.sandbox, docs/rewards.md), each attack judged from the host.

Every attack is a Python program; `breaches` runs each in a real sandbox and returns {attack: what got through}
(empty: all contained). For the Python tool, `tool_breaches` sends each as a call's code to a real
`PythonEnvironment`. The classes: signals and tracing aimed at the launcher (kill(-1), kill(1), ptrace, /proc/1,
prlimit on it), processes that outlive their request (setsid daemons, double forks, a chain of CPU spinners),
resource floods (a fork bomb, file descriptors, shared memory and System V segments, /dev, inodes, many children
each holding memory, output), the network, files outside, and lone surrogates in a program. A breach is judged by
what the host sees (the sandbox's processes and their CPU time, a listening socket, a host directory) and what the
next request finds, never by the attack's word alone.

Stdlib only (and grpo_fast.sandbox): `python -m grpo_fast.testing.sandbox_attacks LEVEL CONFIG_JSON` runs both
suites and prints the breaches as JSON, so that a test can run them as a user who is not root.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_fast.errors import InfrastructureError
from grpo_fast.sandbox import SandboxConfig, SandboxLimits, Session, containment
from grpo_fast.testing.processes import sandbox_cpu_s, sandbox_of

LIMITS = SandboxLimits(wall_s=10.0, memory_bytes=256 << 20, disk_bytes=16 << 20, nproc=16, output_bytes=1 << 16)
"""Small enough that every flood reaches its limit quickly on a loaded machine."""
CHILD_BYTES = 200 << 20  # each child of the memory attack holds this much (memory_bytes: 256 MiB)

PRELUDE = """
import ctypes, errno, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def attempt(action):
    try:
        result = action()
    except Exception as exc:
        return f"refused: {type(exc).__name__}"
    return "done" if result in (None, 0) else f"result {result}"
def quiet():  # a child lets go of the run's output, which would keep the run waiting for it
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
"""

ATTACKS = {
    # the launcher: PID 1 of the sandbox's namespace, not dumpable, its limits out of reach
    "signals to the launcher": """
for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGSEGV, signal.SIGKILL):
    attempt(lambda: os.kill(1, sig))
attempt(lambda: os.kill(-1, signal.SIGKILL))
for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
    if pid != os.getpid():
        attempt(lambda: os.kill(pid, signal.SIGKILL))
print("signalled")
""",
    "tracing the launcher": """
got = []
if libc.ptrace(16, 1, 0, 0) == 0:  # PTRACE_ATTACH
    got.append("ptrace")
for path in ("/proc/1/mem", "/proc/1/environ", "/proc/1/fd/0", "/proc/1/fd/1"):
    if attempt(lambda: open(path, "rb").read(1)) == "done":
        got.append(path)
if attempt(lambda: os.listdir("/proc/1/fd")) == "done":
    got.append("/proc/1/fd")
import resource
if attempt(lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (3, 3))) == "done":
    got.append("prlimit")
print("BREACH " + " ".join(got) if got else "contained")
""",
    # resources: each flood ends at its limit; the sandbox and the next request are fine
    "fork bomb": """
n = 0
try:
    while n < 10000:
        if os.fork() == 0:
            quiet()
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError:
    pass
print(f"forked {n}")
""",
    "file descriptors": """
opened = []
try:
    while len(opened) < 100000:
        opened.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
for fd in opened:  # (the Python tool's interpreter lives on: its next call needs a descriptor)
    os.close(fd)
print(f"opened {len(opened)}")
""",
    "shared memory": """
libc.shmat.restype = ctypes.c_void_p
total = 0
while total < (1 << 30):  # System V segments, detached: no process's address space counts them
    sid = libc.shmget(0, 8 << 20, 0o1000 | 0o600)
    if sid < 0:
        break
    addr = libc.shmat(sid, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        break
    ctypes.memset(addr, 1, 8 << 20)
    libc.shmdt(ctypes.c_void_p(addr))
    total += 8 << 20
written = 0
try:
    with open("/dev/shm/flood", "wb") as f:
        while written < (1 << 30):
            f.write(b"x" * (1 << 20))
            f.flush()
            written += 1 << 20
except OSError:
    pass
print(f"segments {total} shm {written}")
""",
    "writing /dev": """
got = [p for p in ("/dev/flood", "/dev/null.d", "/dev/pts/x") if attempt(lambda p=p: open(p, "w").write("x")) == "done"]
print("BREACH " + " ".join(got) if got else "contained")
""",
    "inodes": """
n = 0
try:
    while n < 10 ** 6:
        open(f"/sandbox/f{n}", "w").close()
        n += 1
except OSError:
    pass
print(f"files {n}")
""",
    "children holding memory": f"""
children = {{}}
for _ in range(6):
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        quiet()
        try:
            block = bytearray({CHILD_BYTES})
            for i in range(0, len(block), 4096):
                block[i] = 1
            os.write(writer, b"x")
        except MemoryError:
            os._exit(1)
        time.sleep(60)
        os._exit(0)
    os.close(writer)
    os.set_blocking(reader, False)
    children[pid] = reader
holding, dead, end = set(), set(), time.time() + 30
while len(holding | dead) < len(children) and time.time() < end:  # each child: dead, or holding its block
    for pid, reader in children.items():
        if pid in dead:
            continue
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            dead.add(pid)
        elif pid not in holding:
            try:
                if os.read(reader, 1):
                    holding.add(pid)
            except BlockingIOError:
                pass
    time.sleep(0.05)
time.sleep(0.5)
alive = [p for p in holding - dead if os.waitpid(p, os.WNOHANG)[0] == 0]
print(f"held {{len(alive)}}")
""",
    "output": """
sys.stdout.write("x" * (64 << 20))
print("end")
""",
    # processes that outlive their request
    "detached daemons": """
for _ in range(3):
    if os.fork() == 0:
        quiet()
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            end = time.time() + 60
            while time.time() < end:
                pass
        os._exit(0)
print("daemons started")
""",
    "a chain of spinners": """
def link(n):
    if n and os.fork() == 0:
        quiet()
        os.setsid()
        if os.fork() == 0:
            end = time.process_time() + 0.5
            while time.process_time() < end:
                pass
            link(n - 1)
        os._exit(0)
link(8)
print("chain started")
""",
}
"""Attack name -> the program (after PRELUDE)."""


@dataclass
class Host:
    """What the host watches: a listening socket the sandbox must not reach and a world-writable directory it must
    not write."""

    listener: socket.socket
    directory: Path

    @property
    def outside(self) -> str:
        port = self.listener.getsockname()[1]
        return f"""
import socket
for action in (lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"x"),
               lambda: open({str(self.directory / "escaped")!r}, "w").write("x")):
    attempt(action)
print("tried")
"""

    def reached(self) -> str | None:
        try:
            self.listener.accept()[0].close()
            return "a host socket was reached"
        except BlockingIOError:
            pass
        return f"files written outside: {os.listdir(self.directory)}" if os.listdir(self.directory) else None


@contextlib.contextmanager
def host() -> Iterator[Host]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    with tempfile.TemporaryDirectory() as scratch:
        os.chmod(scratch, 0o777)
        try:
            yield Host(listener, Path(scratch))
        finally:
            listener.close()


@dataclass(frozen=True)
class Outcome:
    """What one attack did, as seen from the host: its last line of output ("" when its request failed), why its
    request failed (None: it answered), the sandbox's processes left afterwards (the stopped interpreter of the
    Python tool not counted) and how many of them were running, the CPU seconds the sandbox spent in the half second
    after, and what the next request of the sandbox found ("clean": no shared memory left, or why it failed)."""

    report: str
    failed: str | None
    left: int
    running: int
    cpu_after_s: float
    after: str


def judge(name: str, outcome: Outcome, limits: SandboxLimits, whole: bool) -> str | None:
    """What got through (None: the attack was contained), against the limits the attack must stay within; the
    memory of children only where a control group bounds the sandbox as a whole (`whole`)."""
    if outcome.failed is not None and outcome.failed.startswith("lost:"):
        return f"the sandbox was lost: {outcome.failed}"
    words = outcome.report.split()
    if "BREACH" in words:
        return outcome.report[:300]
    numbers = [int(w) for w in words if w.isdigit()]
    bounds = {
        "fork bomb": limits.nproc,
        "file descriptors": 256,
        "inodes": max(1024, limits.disk_bytes // 4096),
        "shared memory": 2 * limits.disk_bytes,  # segments (refused) and /dev/shm, within disk_bytes
    }
    if name in bounds and numbers and sum(numbers) > bounds[name]:
        return f"{outcome.report[:200]} (bound {bounds[name]})"
    if name == "children holding memory" and whole and numbers and numbers[0] * CHILD_BYTES > limits.memory_bytes:
        return f"{outcome.report} (memory_bytes {limits.memory_bytes})"
    if name == "cpu budget":  # spinners given 1 CPU second: stopped within a few checks of it
        return None if outcome.cpu_after_s < 1.5 else f"spinners given 1 CPU second used {outcome.cpu_after_s:.2f}"
    if outcome.left or outcome.running:
        return f"{outcome.left} processes outlived the request, {outcome.running} of them running"
    if outcome.cpu_after_s > 0.05:
        return f"the sandbox used {outcome.cpu_after_s:.2f} CPU seconds after the request"
    return None if outcome.after == "clean" else f"the next request found: {outcome.after[:200]}"


def measure(level: str, config: SandboxConfig, limits: SandboxLimits = LIMITS) -> dict[str, Outcome]:
    """Each attack as a stdin/stdout run in a sandbox of `level` of its own, as each completion gets one:
    {attack: Outcome}; "cpu budget": spinners given 1 CPU second, their CPU seconds (`cpu_after_s`: used in the
    run) and wall seconds (`report`)."""
    found = {}
    with host() as watched:
        for name, program in {**ATTACKS, "outside": watched.outside}.items():
            with Session(level, limits, sys.executable, {}, cgroup_parent=config.cgroup) as session:
                found[name] = _run_one(session, program, limits)
        if watched.reached():
            found["outside"] = Outcome(f"BREACH {watched.reached()}", None, 0, 0, 0.0, "clean")
    with Session(level, limits, sys.executable, {}, cgroup_parent=config.cgroup) as session:
        found["cpu budget"] = _cpu_budget(session)
    return found


def breaches(level: str, config: SandboxConfig, limits: SandboxLimits = LIMITS) -> dict[str, str]:
    """{attack: what got through} of `measure` (empty: every attack contained)."""
    _, whole = containment(level, config)
    judged = {name: judge(name, outcome, limits, whole) for name, outcome in measure(level, config, limits).items()}
    return {name: why for name, why in judged.items() if why}


def _run_one(session: Session, program: str, limits: SandboxLimits) -> Outcome:
    written = session.request({"op": "write", "files": {"attack.py": PRELUDE + program}}, 10.0)
    if written.get("written") is not True:
        return Outcome("", f"lost: before the attack: {written}", 0, 0, 0.0, "")
    answer = session.request({"op": "run", "argv": [sys.executable, "-I", "attack.py"], "stdin": ""}, limits.wall_s)
    if "error" in answer:
        return Outcome("", f"lost: {answer['error']}", 0, 0, 0.0, "")
    left = [i for i in sandbox_of(session.proc.pid).values() if i.namespace_pid != 1]
    cpu = _cpu_after(session.proc.pid)
    check = session.request({"op": "run", "argv": [sys.executable, "-I", "-c", _AFTER], "stdin": ""}, limits.wall_s)
    after = check.get("stdout", "").strip() or str(check)
    report = answer["stdout"].strip().splitlines()[-1:] or [""]
    return Outcome(report[0][:300], None, len(left), sum(i.state not in "TtZX" for i in left), cpu, after)


def _cpu_after(launcher: int, seconds: float = 0.5) -> float:
    before = sandbox_cpu_s(launcher)
    time.sleep(seconds)
    return sandbox_cpu_s(launcher) - before


_AFTER = """
import os
segments = open("/proc/sysvipc/shm").read().splitlines()[1:]
print("clean" if not os.listdir("/dev/shm") and not segments else f"shm {os.listdir('/dev/shm')} {len(segments)}")
"""


def _cpu_budget(session: Session) -> Outcome:
    """Spinners in a run given 1 CPU second in all: stopped once they spent it, long before the wall clock."""
    spin = "import os\nfor _ in range(3):\n    os.fork()\nwhile True:\n    pass\n"  # 8 spinners
    start, cpu = time.monotonic(), sandbox_cpu_s(session.proc.pid)
    answer = session.request({"op": "run", "argv": [sys.executable, "-I", "-c", spin], "stdin": "", "cpu_s": 1}, 120)
    used, wall = sandbox_cpu_s(session.proc.pid) - cpu, time.monotonic() - start
    stopped = answer.get("cpu_exceeded") is True and wall < 110
    report = f"wall {wall:.1f} s" if stopped else f"BREACH spinners given 1 CPU second ran on: {str(answer)[:200]}"
    return Outcome(report, None, 0, 0, used, "clean")


def _python_tool() -> Any:
    """grpo_fast.rollout.python_tool (loaded from its file where the rollout package's engines, which need torch,
    cannot be imported: as a user with the system Python)."""
    try:
        from grpo_fast.rollout import python_tool
    except ImportError:
        path = Path(__file__).resolve().parents[1] / "rollout" / "python_tool.py"
        spec = importlib.util.spec_from_file_location("grpo_fast_python_tool", path)
        python_tool = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = python_tool
        spec.loader.exec_module(python_tool)
    return python_tool


def measure_tool(config: SandboxConfig, limits: SandboxLimits = LIMITS) -> dict[str, Outcome]:
    """Each attack as a Python-tool call's code, a rollout of its own: {attack: Outcome} ("failed": the call's
    ToolCallFailed, the model's failure; "lost: ..." where it raised InfrastructureError, which would stop a run);
    "abandoned call": how long a rollout's reset waited for a call its caller gave up on (`report`)."""
    tool = _python_tool()
    found = {}
    environment = tool.PythonEnvironment(sandbox=config, limits=limits, max_output_chars=1000)
    try:
        with host() as watched:
            for name, program in {**ATTACKS, "outside": watched.outside, "a background thread": _THREAD}.items():
                environment.reset()
                found[name] = _call_one(tool, environment, PRELUDE + program)
            if watched.reached():
                found["outside"] = Outcome(f"BREACH {watched.reached()}", None, 0, 0, 0.0, "clean")
        found["abandoned call"] = _abandoned(environment)
    finally:
        environment.close()
    return found


def tool_breaches(config: SandboxConfig, limits: SandboxLimits = LIMITS) -> dict[str, str]:
    """{attack: what got through} of `measure_tool`: a call may fail (the model's failure), never stop the run; the
    next call must work; after each call only the stopped interpreter may be left, spending no CPU; shared memory is
    gone; a reset does not wait for an abandoned call."""
    _, whole = containment(_python_tool().choose(config), config)
    judged = {name: judge(name, outcome, limits, whole) for name, outcome in measure_tool(config, limits).items()}
    return {name: why for name, why in judged.items() if why}


_THREAD = """
import threading
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
print("spinning")
"""


def _call_one(tool: Any, environment: Any, code: str) -> Outcome:
    failed = None
    try:
        output = environment.python(code)
    except tool.ToolCallFailed as exc:
        output, failed = "", str(exc)
    except InfrastructureError as exc:
        return Outcome("", f"lost: the call stopped the run: {exc}", 0, 0, 0.0, "")
    session, left, cpu = environment._interpreter.session, [], 0.0
    if session is not None:
        left = [i for i in sandbox_of(session.proc.pid).values() if i.namespace_pid != 1]
        cpu = _cpu_after(session.proc.pid)
    stopped = [i for i in left if i.state in "Tt"][:1]  # the interpreter, stopped between calls
    left = [i for i in left if i not in stopped]
    try:
        after = environment.python(_AFTER).strip()
    except (tool.ToolCallFailed, InfrastructureError) as exc:
        after = f"the next call failed: {exc}"
    report = output.strip().splitlines()[-1:] or [""]
    return Outcome(report[0][:300], failed, len(left), sum(i.state not in "TtZX" for i in left), cpu, after)


def _abandoned(environment: Any) -> Outcome:
    """A call past its caller's patience is abandoned (the tool loop moves on); the rollout's reset must not wait
    for it."""
    import threading

    caller = threading.Thread(target=lambda: _swallow(environment.python, "while True:\n    pass"), daemon=True)
    caller.start()
    time.sleep(1.0)
    start = time.monotonic()
    environment.reset()
    waited = time.monotonic() - start
    caller.join(30)
    answer = environment.python("6 * 7")
    report = f"reset waited {waited:.3f} s" if waited <= 0.5 else f"BREACH the reset waited {waited:.1f} s"
    return Outcome(report, None, 0, 0, 0.0, "clean" if answer == "42\n" else f"after the reset: {answer!r}")


def _swallow(fn: Callable, *args: Any) -> None:
    with contextlib.suppress(Exception):
        fn(*args)


def main(argv: list[str]) -> None:
    """LEVEL CONFIG_JSON [--measure]: the breaches of both suites as JSON (with --measure: every Outcome)."""
    level, config = argv[0], SandboxConfig.of(json.loads(argv[1]))
    if "--measure" in argv:
        found = {"sandbox": measure(level, config), "tool": measure_tool(config)}
        print(json.dumps({suite: {k: dataclasses.asdict(v) for k, v in found[suite].items()} for suite in found}))
    else:
        print(json.dumps({"sandbox": breaches(level, config), "tool": tool_breaches(config)}))


if __name__ == "__main__":
    main(sys.argv[1:])

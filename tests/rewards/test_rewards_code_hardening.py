"""What a sandbox leaves of the host, and what is left of a sandbox: its lifetime, its resources as a
whole, IPC and host name, the system calls it may make, and a verifier that cannot run programs.

Each test runs real programs in the real sandbox (the namespaces backend where this runs as root, bwrap
otherwise; the unsandboxed levels skip what they do not claim) and checks the host from outside.
"""

from __future__ import annotations

import glob
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_rewards_code import ADD, ADD_TESTS, LIMITS, UNSANDBOXED, sandbox_processes

from grpo_fast.rewards import code_tests
from grpo_fast.sandbox import SandboxLimits, isolation, run_sandboxed
from grpo_fast.sandbox.isolation import probe
from grpo_fast.testing import processes

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
sandboxed = pytest.mark.skipif(isolation() not in ("namespaces", "bwrap"), reason="needs a sandbox backend")


def run(program: str, limits: SandboxLimits = LIMITS) -> dict:
    """One stdin-less run of `program` in a fresh sandbox."""
    runs = [{"argv": [PYTHON, "-I", "solution.py"], "stdin": ""}]
    return run_sandboxed({"solution.py": program}, runs, limits, PYTHON, allow_unsandboxed=UNSANDBOXED)[0]


def _cgroups_available() -> bool:
    try:
        from grpo_fast.sandbox import cgroups
    except ImportError:
        return True
    return cgroups.parents() is not None


def _sandbox_program_running() -> bool:
    for pid in sandbox_processes():
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().endswith(b"solution.py\0"):
                return True
        except OSError:
            pass
    return False


def _scratch_dirs_of(pids: set[int]) -> set[Path]:
    """The sandbox working directories made by `pids` (named after the process that made them); those of
    other programs on the host are not this test's to see."""
    scratch = Path(tempfile.gettempdir())
    return {path for path in scratch.glob("grpo-sandbox-*") if path.name.split("-")[2] in {str(pid) for pid in pids}}


@pytest.mark.parametrize("backend", [level for level in ("namespaces", "bwrap") if probe(level) is None] or ["none"])
def test_killing_the_scorer_takes_its_sandbox_and_scratch_space_along(backend):
    if backend == "none":
        pytest.skip("needs a sandbox backend")
    script = (
        "from grpo_fast.rewards import code_tests\n"
        "code_tests(['p'], ['import time\\ntime.sleep(120)\\ndef f(x):\\n    return x\\n'], [['assert f(1) == 1']],"
        f" limits={{'wall_s': 60.0}}, sandbox={{'backend': {backend!r}}})\n"
    )
    scorer = subprocess.Popen([PYTHON, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while not _sandbox_program_running():
            assert time.monotonic() < deadline and scorer.poll() is None, "the program never started"
            time.sleep(0.1)
        made = _scratch_dirs_of({scorer.pid, *processes.descendants(scorer.pid)})
        # the namespaces backend mounts its scratch space inside the sandbox; bwrap makes it in the host's /tmp
        assert bool(made) == (backend == "bwrap"), made
    finally:
        scorer.send_signal(signal.SIGKILL)
        scorer.wait()
    deadline = time.monotonic() + 5
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == []
    assert code_tests(["p"], [ADD], [ADD_TESTS], limits=LIMITS) == [1.0]  # sweeps what the dead scorer left
    assert {path for path in made if path.exists()} == set()  # bwrap's empty mount points, swept by the next sandbox
    assert glob.glob(f"/sys/fs/cgroup/**/grpo-sandbox-{scorer.pid}-*", recursive=True) == []


HOLDERS = """
import os, select, time
size, children = {size}, {children}
ready_r, ready_w = os.pipe()
for _ in range(children):
    if os.fork() == 0:
        block = b"x" * size  # touched: every page is in memory
        os.write(ready_w, b"%d " % os.getpid())
        time.sleep(30)
        os._exit(0)
reported, end = b"", time.monotonic() + 3
while time.monotonic() < end:
    if select.select([ready_r], [], [], 0.2)[0]:
        reported += os.read(ready_r, 4096)
held = 0  # children that reported their block and are still alive: they hold it at the same time
for pid in map(int, reported.split()):
    if os.waitpid(pid, os.WNOHANG) == (0, 0):
        held += 1
print(held, flush=True)
os.killpg(0, 9)
"""


@sandboxed
@pytest.mark.skipif(not _cgroups_available(), reason="no control group can be made here (see cgroups.py)")
def test_memory_is_bounded_for_the_sandbox_as_a_whole():
    """Six processes under a 256 MiB limit each would hold 1.2 GiB; the sandbox's group holds one."""
    limits = SandboxLimits(wall_s=10.0, memory_bytes=256 << 20)
    result = run(HOLDERS.format(size=200 << 20, children=6), limits)
    assert int(result["stdout"]) <= 1, result


@sandboxed
def test_sysv_ipc_is_refused_and_nothing_reaches_the_host():
    """System V objects outlive their processes and a detached segment counts in no address space: refused."""
    key = int.from_bytes(os.urandom(3), "big") + 1
    program = f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.shmget({key}, 1 << 20, 0o1666), libc.msgget({key}, 0o1666), libc.semget({key}, 1, 0o1666))
"""
    try:
        assert run(program)["stdout"].split() == ["-1", "-1", "-1"]
        for table in ("shm", "msg"):
            keys = [line.split()[0] for line in Path(f"/proc/sysvipc/{table}").read_text().splitlines()[1:]]
            assert str(key) not in keys, f"a sandbox's SysV {table} object is still on the host"
    finally:
        subprocess.run(["ipcrm", "-M", str(key), "-Q", str(key)], capture_output=True)


@sandboxed
def test_the_host_name_is_not_the_hosts():
    assert run("import socket\nprint(socket.gethostname())")["stdout"].strip() not in ("", socket.gethostname())


_SYSCALLS = {"x86_64": {"keyctl": 250, "io_uring_setup": 425}, "aarch64": {"keyctl": 219, "io_uring_setup": 425}}


@pytest.mark.skipif(platform.machine() not in _SYSCALLS, reason="system call numbers for x86_64 and aarch64 only")
def test_system_calls_no_test_program_needs_are_refused():
    numbers = _SYSCALLS[platform.machine()]
    program = f"""
import ctypes, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
def errno(result):
    return 0 if result == 0 else ctypes.get_errno()
print(errno(libc.ptrace(0, 0, 0, 0)), errno(libc.syscall({numbers["keyctl"]}, 0, -3, 0)))
print(errno(libc.syscall({numbers["io_uring_setup"]}, 1, 0)), errno(libc.unshare(0x10000000)))
thread = threading.Thread(target=print, args=("thread",))
thread.start()
thread.join()
print(subprocess.run(["/bin/echo", "child"], capture_output=True, text=True).stdout.strip())
"""
    assert run(program)["stdout"].split() == ["1", "1", "1", "1", "thread", "child"]  # EPERM = 1


def test_a_verifier_that_cannot_run_programs_says_so_before_scoring(tmp_path):
    """An interpreter that works here but not in the sandbox (a wrapper that execs a path the sandbox does
    not show): every program, correct ones included, would score 0. The start-up check says why."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "python3").symlink_to(PYTHON)
    wrapper = tmp_path / "env" / "bin" / "python"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f'#!/bin/sh\nexec {hidden}/python3 "$@"\n')
    wrapper.chmod(0o755)
    for path in (tmp_path, tmp_path / "env", wrapper.parent):
        path.chmod(0o755)
    assert subprocess.run([str(wrapper), "-c", "print(1)"], capture_output=True).stdout == b"1\n"
    with pytest.raises(RuntimeError, match=rf"(?s)start-up check.*{hidden}/python3"):
        code_tests(["p"], [ADD], [ADD_TESTS], limits=LIMITS, python=str(wrapper), allow_unsandboxed=UNSANDBOXED)

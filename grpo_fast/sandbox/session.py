"""Run untrusted programs in a local sandbox: the caller's side of `_launcher.py`.

A `Session` is one sandbox: a launcher process started for a backend of backends.py ("namespaces",
"bwrap", or an unsandboxed level), set up once, then asked to run programs or servers on request
(the protocol: _launcher.py). The caller trusts nothing that comes back: every answer is one line
read within a deadline and a size bound, and a launcher that dies, overruns or garbles its answer
only yields {"error": ...} (the session is then closed).

Lifetime: the launcher dies with the process (the thread) that started it (a parent-death signal;
bwrap's --die-with-parent), and takes its sandbox with it: in the namespaces and bwrap backends the
whole PID namespace goes when its first process does, and `close` only has to kill that process
(`reap` finishes the teardown later). Where control groups can be made (cgroups.py, under
`cgroup_parent`), the sandbox's programs run in one, with `memory_bytes`, process and CPU limits for all
of them (the launcher stays out of it, out of reach of its out-of-memory killer), and whatever is left in
it is killed before the group is removed. The bwrap backend mounts its root on an empty temporary
directory, and the unsandboxed levels work in one; both are named after this process, removed by
`close`, or by a later process's `sweep` if this one dies first.

Always: CPU seconds, address space, file size, process count and open-file limits per process; a
wall-clock limit per request, after which the launcher kills what it started, and in the namespaces and
bwrap backends a CPU-time limit for all of a request's processes together, and nothing of the sandbox
running between two requests (_launcher.py); stdout/stderr and
answers capped at `output_bytes`; environment reduced to a fixed PATH/HOME/TMPDIR/locale; the
seccomp filter of seccomp.py where the architecture is known.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from grpo_fast.errors import InfrastructureError
from grpo_fast.sandbox import cgroups
from grpo_fast.sandbox.backends import ROOT_MOUNT, binds, launcher_argv
from grpo_fast.sandbox.config import SandboxLimits
from grpo_fast.sandbox.seccomp import denylist_filter

SANDBOX_UIDS = range(200_000, 200_000 + (1 << 24))
"""The uids the namespaces and uid levels run programs as: a fresh random one per sandbox."""
_GRACE_S = 5.0  # how long past a request's own time limit the launcher may take to answer
_SETUP_S = 30.0  # how long a launcher may take to set its sandbox up
_WORKDIR_PREFIX = "grpo-sandbox-"


class Session:
    """One sandbox (see module doc). The launcher starts at once; `ready()` (or the first `request`)
    waits until it is set up and raises InfrastructureError when it cannot be. Requests may be posted
    ahead (`post`) and their answers collected later, in order (`collect`)."""

    def __init__(
        self,
        level: str,
        limits: SandboxLimits,
        python: str,
        files: Mapping[str, str],
        *,
        cpu_s: int | None = None,
        cgroup: bool = True,
        cgroup_parent: str | None = None,
    ) -> None:
        self.level, self.limits = level, limits
        self.workdir = self.rootdir = self.cgroup = None
        self.buffer = b""
        self.closed = self.set_up = False
        self.posted: deque[tuple[float, bool]] = deque()  # (deadline, whether it is the job) per answer owed
        reap()
        _sweep_workdirs()
        if level == "namespaces":
            _root_mount()
        else:
            made = tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-")
            if level == "bwrap":  # the mount point of the sandbox's root, in its own mount namespace only
                self.rootdir = made
            else:
                self.workdir = made
        if cgroup:
            cgroups.sweep(cgroup_parent)
            self.cgroup = cgroups.Cgroup.create(limits.memory_bytes, limits.nproc, parent=cgroup_parent)
        job = {
            "isolate": level in ("namespaces", "bwrap"),
            "userns": level == "bwrap",
            "root": self.rootdir or ROOT_MOUNT,
            "workdir": self.workdir,
            "binds": binds(python),
            "uid": SANDBOX_UIDS[secrets.randbelow(len(SANDBOX_UIDS))] if level in ("namespaces", "uid") else None,
            "limits": {**asdict(limits), "cpu_s": cpu_s or math.ceil(limits.wall_s) + 1},
            "seccomp": denylist_filter(),
            "files": dict(files),
        }
        self._start(job, python)

    def _start(self, job: dict[str, Any], python: str) -> None:
        """Start the launcher with the control group's cgroup.procs files open for it: every program joins the
        group through them; the launcher itself stays out of it, out of reach of its limits."""
        procs = [os.open(path, os.O_WRONLY) for path in self.cgroup.procs_files()] if self.cgroup else []
        try:
            self.proc = subprocess.Popen(
                launcher_argv(self.level, python),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                env={"PATH": os.defpath, "LANG": "C.UTF-8"},
                pass_fds=procs,
            )
        finally:
            for fd in procs:
                os.close(fd)
        try:
            self._post({**job, "cgroup": procs}, _SETUP_S + self.limits.wall_s, job=True)
        except OSError as exc:
            self._fail_setup({"error": f"{type(exc).__name__}: {exc}"})

    def ready(self) -> None:
        """Wait until the sandbox is set up; InfrastructureError (and the session closed) when it is not."""
        if not self.set_up and self.posted and self.posted[0][1]:
            answer = self.collect()
            if answer.get("ready") is not True:
                self._fail_setup(answer)
            self.set_up = True

    def _fail_setup(self, answer: Mapping[str, Any]) -> None:
        stderr = self._stderr()
        self.close()
        cause = answer.get("setup_error") or answer.get("error") or answer
        raise InfrastructureError(f"sandbox ({self.level}) could not be set up: {cause}; {stderr}".rstrip("; "))

    def post(self, message: Mapping[str, Any], timeout: float) -> None:
        """Send a request (the launcher's own time limit `timeout`) whose answer `collect` reads later
        (possibly before the sandbox is set up: the launcher reads its requests in order)."""
        self._post({**message, "timeout": timeout}, timeout + _GRACE_S)

    def request(self, message: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """The launcher's answer to `message` (its own time limit `timeout`), or {"error": ...}."""
        self.ready()
        if self.posted:
            raise RuntimeError("Session.request: collect the answers of the requests posted first")
        if self.closed:
            return {"error": "the sandbox is closed"}
        self._post({**message, "timeout": timeout}, timeout + _GRACE_S)
        return self.collect()

    def _post(self, message: Mapping[str, Any], timeout: float, job: bool = False) -> None:
        if self.closed:
            return
        self.posted.append((time.monotonic() + timeout, job))
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            pass  # the launcher is gone: collect says so

    def collect(self) -> dict[str, Any]:
        """The answer to the oldest request posted and not collected, or {"error": ...}."""
        if self.closed or not self.posted:
            return {"error": "the sandbox is closed"}
        deadline, _ = self.posted.popleft()
        line = self._read_line(deadline)
        if line is None:
            return self._broken("the sandbox's launcher did not answer in time (or died)")
        try:
            answer = json.loads(line)
        except (ValueError, RecursionError):
            return self._broken("the sandbox's launcher answered garbage")
        return answer if isinstance(answer, dict) else self._broken("the sandbox's launcher answered garbage")

    def _broken(self, why: str) -> dict[str, Any]:
        self.close()
        return {"error": why, "launcher": True}

    def _read_line(self, deadline: float) -> bytes | None:
        fd, limit = self.proc.stdout.fileno(), 8 * self.limits.output_bytes + (1 << 20)
        while b"\n" not in self.buffer:
            # Past the deadline what is already in the pipe is still read: an answer written in time but collected
            # late (a session set up ahead and used minutes later) is not a launcher that failed to answer.
            left = max(deadline - time.monotonic(), 0.0)
            if len(self.buffer) > limit or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line if len(line) <= limit else None

    def _stderr(self) -> str:
        """What the launcher wrote on stderr (read only once it is gone: it writes there only when it fails)."""
        try:
            self.proc.kill()
            return self.proc.stderr.read(8000).decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    def kill(self) -> None:
        """Kill the launcher, and with it the sandbox, from any thread (a request in flight then fails at once); the
        thread that uses the session still closes it."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        """Stop the launcher and everything it started; remove the control group and the workdir.
        A namespaces or bwrap sandbox is killed whole (its PID namespace goes with its first process)
        and left to the kernel to tear down: its process is reaped and its group removed by a later
        Session (or at exit). The unsandboxed levels are waited for: their launcher kills what the
        program left behind."""
        if self.closed:
            return
        self.closed = True
        if self.level in ("uid", "rlimits"):
            try:
                self.proc.stdin.close()  # the launcher kills its children and exits at the end of its input
                self.proc.wait(timeout=2.0)
            except (OSError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        with _lock:
            _closing.append(self)
        reap()

    def _finished(self, block: bool) -> bool:
        """Reap the launcher and remove what is left of the sandbox: whether that is done."""
        if block:
            self.proc.wait()
        elif self.proc.poll() is None:
            return False
        if self.cgroup is not None and not self.cgroup.remove(wait=block):
            return False
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self.rootdir is not None:
            try:
                os.rmdir(self.rootdir)  # empty on the host: the sandbox's mounts were in its own namespace
            except OSError:
                pass
        return True

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_closing: list[Session] = []
_lock = threading.Lock()


def reap(block: bool = False) -> None:
    """Finish the teardown of closed sessions (all of them with `block`; else those that are done)."""
    with _lock:
        _closing[:] = [session for session in _closing if not session._finished(block)]


atexit.register(reap, True)


def _root_mount() -> None:
    """The namespaces backend's mount point (backends.ROOT_MOUNT): an empty directory owned by root."""
    os.makedirs(ROOT_MOUNT, mode=0o755, exist_ok=True)
    info = os.lstat(ROOT_MOUNT)
    if not Path(ROOT_MOUNT).is_dir() or Path(ROOT_MOUNT).is_symlink() or info.st_uid != 0:
        raise InfrastructureError(f"sandbox: {ROOT_MOUNT} must be a directory owned by root")


def _sweep_workdirs() -> None:
    """Remove the working directories of processes that died before removing them."""
    for path in Path(tempfile.gettempdir()).glob(f"{_WORKDIR_PREFIX}*"):
        owner = path.name[len(_WORKDIR_PREFIX) :].split("-")[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            shutil.rmtree(path, ignore_errors=True)

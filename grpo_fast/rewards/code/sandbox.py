"""Run untrusted programs in a local sandbox: the caller's side of `_launcher.py`.

A `Session` is one sandbox: a launcher process started for a backend of isolation.py ("namespaces",
"bwrap", or an unsandboxed level), set up once, then asked to run programs or servers on request
(the protocol: _launcher.py). The caller trusts nothing that comes back: every answer is one line
read within a deadline and a size bound, and a launcher that dies, overruns or garbles its answer
only yields {"error": ...} (the session is then closed).

Lifetime: the launcher dies with the process that started it (a parent-death signal; bwrap's
--die-with-parent), and takes its sandbox with it: in the namespaces and bwrap backends the whole
PID namespace goes when its first process does. Where control groups can be made (cgroups.py), the
sandbox runs in one, with `memory_bytes` (plus the launcher's share), process and CPU limits for
all of it, and `close` kills whatever is left in it. The unsandboxed levels work in a temporary
directory named after this process, removed by `close`, or by a later process's `sweep` if this
one dies first.

Always: CPU seconds, address space, file size, process count and open-file limits per process; a
wall-clock limit per request, after which the launcher kills what it started; stdout/stderr and
answers capped at `output_bytes`; environment reduced to a fixed PATH/HOME/TMPDIR/locale; the
seccomp filter of seccomp.py where the architecture is known.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grpo_fast.rewards.code import cgroups
from grpo_fast.rewards.code.isolation import ROOT_MOUNT, SandboxConfig, binds, choose, launcher_argv
from grpo_fast.rewards.code.seccomp import denylist_filter
from grpo_fast.rewards.outcomes import InfrastructureError

_UID_BASE, _UID_SPAN = 200_000, 1 << 24
_GRACE_S = 5.0  # how long past a request's own time limit the launcher may take to answer
_LAUNCHER_MEMORY = 128 << 20  # the launcher's own share of a control group's memory limit
_WORKDIR_PREFIX = "grpo-sandbox-"


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandbox.

    wall_s: wall-clock seconds per stdin/stdout run, and per assert test for the program (its load
        and every call of the test) and again for the judge's own work on it.
    cpu_s: CPU seconds per process; None = ceil(wall_s) + 1, times the number of tests for the
        process that answers all of a completion's assert tests.
    memory_bytes: address space per process (RLIMIT_AS), and the whole sandbox's memory where a
        control group can be made. file_bytes: largest file it may write (RLIMIT_FSIZE).
    disk_bytes: size of the writable /sandbox tmpfs. nproc: processes + threads of the sandbox.
    output_bytes: stdout + stderr kept per run, and the largest answer of a call.
    completion_s: wall-clock seconds for all of one completion's tests (the tests left when it runs
        out fail); keep it below the reward pool's timeout (RewardPool also cuts it to the time it
        has left, so that the pool never has to kill a worker for a slow program).
    """

    wall_s: float = 5.0
    cpu_s: int | None = None
    memory_bytes: int = 2 << 30
    file_bytes: int = 16 << 20
    disk_bytes: int = 64 << 20
    nproc: int = 32
    output_bytes: int = 1 << 20
    completion_s: float = 20.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and value <= 0:
                raise ValueError(f"SandboxLimits.{name}: must be > 0, got {value}")

    @classmethod
    def of(cls, limits: SandboxLimits | Mapping[str, Any] | None) -> SandboxLimits:
        """Limits from themselves, a mapping of the fields (as a YAML config gives them) or None."""
        if isinstance(limits, Mapping):
            return cls(**limits)
        return limits or cls()


class Session:
    """One sandbox (see module doc). Raises InfrastructureError when it cannot be set up."""

    def __init__(
        self,
        level: str,
        limits: SandboxLimits,
        python: str,
        files: Mapping[str, str],
        *,
        cpu_s: int | None = None,
        cgroup: bool = True,
    ) -> None:
        self.level, self.limits = level, limits
        self.workdir = self.cgroup = None
        self.buffer = b""
        self.closed = False
        if level == "namespaces":
            _root_mount()
        elif level in ("uid", "rlimits"):
            _sweep_workdirs()
            self.workdir = tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-")
        job = {
            "isolate": level == "namespaces",
            "root": ROOT_MOUNT,
            "workdir": "/sandbox" if level == "bwrap" else self.workdir,
            "binds": binds(python),
            "uid": _UID_BASE + secrets.randbelow(_UID_SPAN) if level in ("namespaces", "uid") else None,
            "limits": {**asdict(limits), "cpu_s": cpu_s or math.ceil(limits.wall_s) + 1},
            "seccomp": denylist_filter(),
            "files": dict(files),
        }
        if cgroup:
            cgroups.sweep()
            self.cgroup = cgroups.Cgroup.create(limits.memory_bytes + _LAUNCHER_MEMORY, limits.nproc + 8)
        self.proc = subprocess.Popen(
            launcher_argv(level, python, limits.disk_bytes),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env={"PATH": os.defpath, "LANG": "C.UTF-8"},
        )
        try:
            if self.cgroup is not None:
                self.cgroup.add(self.proc.pid)
            ready = self._exchange(job, 30.0 + limits.wall_s)
        except OSError as exc:
            ready = {"error": f"{type(exc).__name__}: {exc}"}
        if ready.get("ready") is not True:
            stderr = self._stderr()
            self.close()
            cause = ready.get("setup_error") or ready.get("error") or ready
            raise InfrastructureError(f"sandbox ({level}) could not be set up: {cause}; {stderr}".rstrip("; "))

    def request(self, message: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """The launcher's answer to `message` (its own time limit `timeout`), or {"error": ...}."""
        if self.closed:
            return {"error": "the sandbox is closed"}
        return self._exchange({**message, "timeout": timeout}, timeout + _GRACE_S)

    def _exchange(self, message: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            return self._broken("the sandbox's launcher is gone")
        line = self._read_line(time.monotonic() + timeout)
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
            left = deadline - time.monotonic()
            if left <= 0 or len(self.buffer) > limit or not select.select([fd], [], [], left)[0]:
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

    def close(self) -> None:
        """Stop the launcher and everything it started; remove the control group and the workdir."""
        if self.closed:
            return
        self.closed = True
        try:
            self.proc.stdin.close()  # the launcher kills its children and exits at the end of its input
            self.proc.wait(timeout=2.0)
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_sandboxed(
    files: Mapping[str, str],
    runs: Sequence[Mapping[str, Any]],
    limits: SandboxLimits = SandboxLimits(),
    python: str = sys.executable,
    *,
    sandbox: SandboxConfig | Mapping[str, Any] | str | None = None,
    allow_unsandboxed: bool = False,
) -> list[dict[str, Any]]:
    """Write `files` into a fresh local sandbox and run each {"argv": [...], "stdin": str} there in turn,
    for at most `limits.wall_s` each. Results: _launcher.py's "run" answers, or {"error": ...} where the
    sandbox failed. Raises RuntimeError where no local backend can run programs (unless
    `allow_unsandboxed`, UNSAFE), InfrastructureError where the sandbox cannot be set up."""
    level = choose(SandboxConfig.of(sandbox), allow_unsandboxed)
    if level == "remote":
        raise RuntimeError("run_sandboxed runs programs locally; the remote backend runs them through code_tests")
    with Session(level, limits, python, files) as session:
        message = {"op": "run"}
        return [session.request({**message, **run}, limits.wall_s) for run in runs]


def _root_mount() -> None:
    """The namespaces backend's mount point (isolation.ROOT_MOUNT): an empty directory owned by root."""
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

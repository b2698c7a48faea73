"""Run untrusted programs in a sandbox: the caller's side of `_launcher.py`.

Isolation, strongest available (see `isolation()`):
- "namespaces" (root, and `unshare` permitted): the launcher starts in new mount, network and PID
  namespaces; the program sees a read-only root made of read-only binds of the system and Python
  directories only (no home, no dataset, no test files), a minimal /dev (null, zero, full, random,
  urandom, fd links and a private /dev/shm: no GPU, disk or tty nodes), a fresh /proc showing only its
  own processes, no network interface but a down loopback, and one writable size-limited tmpfs,
  /sandbox (also /tmp). It runs as a fresh random uid (so RLIMIT_NPROC, which root ignores, holds, and
  it can signal nothing but its own processes), with no supplementary groups and no_new_privs.
  This is the only level `run_sandboxed` and `code_tests` use unless told `allow_unsandboxed=True`.
- "uid" (root, but `unshare` refused), UNSAFE: no namespaces; the program still runs as a fresh random
  uid in a temporary working directory it owns, so it cannot write root-owned files, signal other
  processes, or exceed RLIMIT_NPROC, and every process of that uid is killed after each run; it CAN
  read world-readable files (the host's /dev included), write world-writable directories (/tmp) and
  use the network. The interpreter must be readable by other users (one under /root, mode 0700, is
  not: every run then fails with exit code 127).
- "rlimits" (not root), UNSAFE: resource limits, timeouts and scrubbed environment only, as the
  current user: the program can read and write that user's files, signal its processes (the caller's
  included), use the network, and start processes outside the launcher's reach (through other
  services: ssh, cron, systemd); what it leaves among the launcher's descendants (setsid and double
  forks included) is killed after each run, best effort.

Always: CPU seconds, address space, file size, process count and open-file limits; a wall-clock limit
per run (and per test) after which the whole run is killed (SIGKILL to the PID namespace, or to the
sandbox uid, or to the process group and then the launcher's re-parented orphans); stdout/stderr
capped; environment reduced to a fixed PATH/HOME/TMPDIR/locale. The launcher itself runs under an
overall deadline and its process group is killed if it overruns, so nothing outlives a call.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_LAUNCHER = Path(__file__).with_name("_launcher.py")
_NAMESPACES = ["unshare", "--mount", "--net", "--pid", "--fork", "--kill-child"]
_SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin", "/etc")
_UID_BASE, _UID_SPAN = 200_000, 1 << 24


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run.

    wall_s: wall-clock seconds per run, and per test for assert tests (load + each test).
    cpu_s: CPU seconds per process; None = ceil(wall_s) + 1, times the number of tests for the
        process that answers all assert tests.
    memory_bytes: address space (RLIMIT_AS). file_bytes: largest file it may write (RLIMIT_FSIZE).
    disk_bytes: size of the writable /sandbox tmpfs. nproc: processes + threads of the sandbox uid.
    output_bytes: stdout + stderr + answers kept per run; more kills the run.
    """

    wall_s: float = 5.0
    cpu_s: int | None = None
    memory_bytes: int = 2 << 30
    file_bytes: int = 16 << 20
    disk_bytes: int = 64 << 20
    nproc: int = 32
    output_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and value <= 0:
                raise ValueError(f"SandboxLimits.{name}: must be > 0, got {value}")


@functools.cache
def isolation() -> str:
    """The isolation level this process can build: "namespaces", "uid" or "rlimits" (see module doc)."""
    if os.geteuid() != 0:
        log.warning("sandbox: not root; programs could only run as this user with rlimits (no fs/network isolation)")
        return "rlimits"
    if shutil.which("unshare"):
        probe = subprocess.run([*_NAMESPACES, "true"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return "namespaces"
        reason = probe.stderr.decode().strip()
    else:
        reason = "no unshare binary"
    log.warning("sandbox: namespaces unavailable (%s); programs could only run as an unprivileged uid", reason)
    return "uid"


def require_isolation(allow_unsandboxed: bool = False) -> None:
    """Raise unless programs can run in namespaces, or the caller accepts running them without."""
    level = isolation()
    if level == "namespaces" or allow_unsandboxed:
        return
    raise RuntimeError(
        f"code sandbox: this machine only allows isolation level {level!r} "
        f"({'root, but unshare of mount/network/PID namespaces is refused' if level == 'uid' else 'not root'}), "
        "so untrusted programs would run with access to the host's files, processes and network. Run as root "
        "where `unshare --mount --net --pid --fork true` works (in a container: one allowed to unshare, e.g. "
        "started with --privileged or with CAP_SYS_ADMIN and no seccomp/AppArmor block on unshare and mount), "
        "or pass allow_unsandboxed=True to run them anyway (UNSAFE: only for trusted programs)."
    )


def _binds(python: str) -> list[str]:
    candidates = [*_SYSTEM_DIRS, sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(python).resolve().parents[1])]
    dirs = []
    for path in sorted({os.path.abspath(p) for p in candidates if os.path.lexists(p)}):
        if not any(path.startswith(d + "/") for d in dirs if not os.path.islink(d)):
            dirs.append(path)
    return dirs


def run_sandboxed(
    files: Mapping[str, str],
    runs: Sequence[Mapping[str, Any]],
    limits: SandboxLimits = SandboxLimits(),
    python: str = sys.executable,
    *,
    allow_unsandboxed: bool = False,
) -> list[dict[str, Any]]:
    """Write `files` into a fresh sandbox, execute each run there in turn, return one result per run.

    A run is {"argv": [...], "stdin": str | None} (a program reading stdin), or {"argv": [...],
    "probes": [...]} (the probe protocol of `_launcher.py`). Result keys: see `_launcher.py`.
    A launcher that fails or overruns yields {"error": ...} for every run. Raises RuntimeError when
    namespaces are unavailable, unless `allow_unsandboxed` (UNSAFE, see the module doc).
    """
    require_isolation(allow_unsandboxed)
    level = isolation()
    probes = max((len(r.get("probes") or ()) for r in runs), default=0)
    cpu_s = limits.cpu_s or (math.ceil(limits.wall_s) + 1) * (probes + 1)
    scratch = tempfile.mkdtemp(prefix="grpo-sandbox-")
    job = {
        "isolate": level == "namespaces",
        "root": scratch,
        "workdir": scratch,
        "binds": _binds(python),
        "uid": None if level == "rlimits" else _UID_BASE + secrets.randbelow(_UID_SPAN),
        "limits": {**asdict(limits), "cpu_s": cpu_s},
        "files": dict(files),
        "runs": [dict(r) for r in runs],
    }
    command = [python, "-I", "-S", str(_LAUNCHER)]
    deadline = 5.0 + limits.wall_s * sum(2 * len(r.get("probes") or ()) + 1 for r in runs)
    proc = subprocess.Popen(
        [*_NAMESPACES, *command] if level == "namespaces" else command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={"PATH": os.defpath, "LANG": "C.UTF-8"},
    )
    try:
        out, err = proc.communicate(json.dumps(job).encode(), timeout=deadline)
        return json.loads(out)["runs"]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return [{"error": f"sandbox overran its {deadline:.0f} s deadline"}] * len(runs)
    except (ValueError, KeyError):
        return [{"error": f"sandbox launcher failed: {err.decode(errors='replace')[-2000:]}"}] * len(runs)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)

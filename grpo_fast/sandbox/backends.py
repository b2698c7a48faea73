"""The sandbox backends as declarations: how each starts a launcher (argv, bind mounts). Which one runs on this
machine is isolation.py's business; a `SandboxConfig` (config.py) chooses one.

Backends, strongest first (what each guarantees: docs/rewards.md, "The code sandbox"):
- "namespaces": root; the launcher itself enters new mount, network, PID, IPC and UTS namespaces and
  runs programs as a fresh random uid (_launcher.py).
- "bwrap": bubblewrap, unprivileged user namespaces: the launcher runs inside `bwrap` (new user,
  mount, network, PID, IPC, UTS and cgroup namespaces, no further user namespaces, all capabilities
  dropped, a read-only root of the system and Python directories, a tmpfs /sandbox).
- "remote": a SandboxFusion-compatible HTTP service (grpo_fast.rewards.code.remote); programs never run on this
  machine.
Unsafe levels, used only with `allow_unsandboxed=True`: "uid" (root without namespaces: a fresh uid,
limits) and "rlimits" (limits only, as the calling user).
"""

from __future__ import annotations

import functools
import os
import site
import subprocess
import sys
from pathlib import Path

_LAUNCHER_SOURCE = Path(__file__).with_name("_launcher.py").read_text(encoding="utf-8")
_SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin", "/etc")
ROOT_MOUNT = "/run/grpo-fast-sandbox"
"""Where the namespaces backend mounts each sandbox's root, in the sandbox's own mount namespace only
(one empty root-owned directory for all sandboxes; nothing is ever written there on the host)."""


def binds(python: str) -> list[str]:
    """Host paths a sandbox shows read-only: the system directories, this Python's prefixes, and the
    prefix of every hop of `python`'s symbolic links (a virtual environment's interpreter is a link
    into the base installation)."""
    candidates = [*_SYSTEM_DIRS, sys.prefix, sys.base_prefix, sys.exec_prefix]
    path = Path(os.path.abspath(python))
    for _ in range(40):
        candidates.append(str(path.parent.parent))
        if not path.is_symlink():
            break
        path = Path(os.path.normpath(path.parent / os.readlink(path)))
    dirs: list[str] = []
    for candidate in sorted({os.path.abspath(p) for p in candidates if p != "/" and os.path.lexists(p)}):
        if not any(candidate.startswith(d + "/") for d in dirs if not os.path.islink(d)):
            dirs.append(candidate)
    return dirs


def launcher_argv(level: str, python: str, disk_bytes: int) -> list[str]:
    """The command that starts a launcher for `level` (its job: sandbox.Session)."""
    launcher = [python, "-I", "-S", "-c", _LAUNCHER_SOURCE]
    if level != "bwrap":
        return [*launcher, str(os.getpid())]
    return [*bwrap_argv(python, disk_bytes), *launcher, "0"]  # bwrap's --die-with-parent ties it to this process


@functools.cache
def _bwrap_options() -> frozenset[str]:
    text = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=30).stdout
    return frozenset(word for word in text.split() if word.startswith("--"))


def bwrap_argv(python: str, disk_bytes: int) -> list[str]:
    """bubblewrap's part of the "bwrap" command (see module doc); /sandbox holds `disk_bytes`."""
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if "--disable-userns" in _bwrap_options():
        argv.append("--disable-userns")
    if os.geteuid() == 0:  # root would stay uid 0 inside: run as an unprivileged uid instead
        argv += ["--uid", "65534", "--gid", "65534"]
    for path in binds(python):
        argv += ["--symlink", os.readlink(path), path] if os.path.islink(path) else ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--hostname", "sandbox"]
    argv += ["--size", str(disk_bytes)] if "--size" in _bwrap_options() else []
    argv += ["--tmpfs", "/sandbox"]
    if not any(p == "/tmp" or p.startswith("/tmp/") for p in binds(python)):
        argv += ["--symlink", "/sandbox", "/tmp"]
    return [*argv, "--chdir", "/sandbox", "--"]


def runner_argv(python: str, source: str, *args: str) -> list[str]:
    """The command that runs a runner's `source` with `python` in a sandbox. For this process's own
    interpreter: `-I -S` with its site-packages directories put on sys.path, since processing their
    .pth files takes longer than the rest of a start; for another: `-I`."""
    if os.path.abspath(python) != os.path.abspath(sys.executable):
        return [python, "-I", "-c", source, *args]
    paths = [path for path in site.getsitepackages() if os.path.isdir(path)]
    return [python, "-I", "-S", "-c", f"import sys; sys.path.extend({paths!r})\n" + source, *args]

"""The sandbox backends as declarations: how each starts a launcher (argv, bind mounts). Which one runs on this
machine is isolation.py's business; a `SandboxConfig` (config.py) chooses one.

Backends, strongest first (what each guarantees: docs/rewards.md, "The code sandbox"):
- "namespaces": root; the launcher itself enters new mount, network, PID, IPC and UTS namespaces and
  runs programs as a fresh random uid (_launcher.py).
- "bwrap": bubblewrap, unprivileged user namespaces: bubblewrap gives the launcher a user namespace with
  capabilities there, in which it builds the same sandbox as "namespaces"; programs run with no
  capability, as the caller's uid.
- "remote": a SandboxFusion-compatible HTTP service (grpo_fast.rewards.code.remote); programs never run on this
  machine.
Unsafe levels, used only with `allow_unsandboxed=True`: "uid" (root without namespaces: a fresh uid,
limits) and "rlimits" (limits only, as the calling user).
"""

from __future__ import annotations

import os
import site
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


def launcher_argv(level: str, python: str) -> list[str]:
    """The command that starts a launcher for `level` (its job: session.Session)."""
    launcher = [python, "-I", "-S", "-c", _LAUNCHER_SOURCE]
    if level != "bwrap":
        return [*launcher, str(os.getpid())]
    return [*BWRAP, *launcher, "0"]  # bwrap's --die-with-parent ties it to this process


BWRAP = (
    *("bwrap", "--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-add", "ALL"),
    *("--die-with-parent", "--new-session", "--bind", "/", "/", "--dev-bind", "/dev", "/dev", "--"),
)
"""bubblewrap's part of the "bwrap" command: a user namespace in which the launcher holds every capability (as uid
65534 there, mapped to the caller's uid), the host's files as they are (its view of the system, whose parts it binds
into the sandbox's own root), a session of its own, death with the caller. The launcher then builds the same
sandbox as for "namespaces" (_launcher.py)."""


RUNNER_CHANNEL = Path(__file__).with_name("runner_channel.py").read_text(encoding="utf-8")
"""The source prepended to each runner's: its channel to the launcher (runner_channel.py)."""


def runner_argv(python: str, source: str, *args: str) -> list[str]:
    """The command that runs a runner's `source` with `python` in a sandbox. For this process's own
    interpreter: `-I -S` with its site-packages directories put on sys.path, since processing their
    .pth files takes longer than the rest of a start; for another: `-I`."""
    if os.path.abspath(python) != os.path.abspath(sys.executable):
        return [python, "-I", "-c", source, *args]
    paths = [path for path in site.getsitepackages() if os.path.isdir(path)]
    return [python, "-I", "-S", "-c", f"import sys; sys.path.extend({paths!r})\n" + source, *args]

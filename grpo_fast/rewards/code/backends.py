"""The sandbox backends as declarations: their names, a `SandboxConfig` choosing one, and how each starts a
launcher (argv, bind mounts). Which one runs on this machine is isolation.py's business.

Backends, strongest first (what each guarantees: docs/rewards.md, "The code sandbox"):
- "namespaces": root; the launcher itself enters new mount, network, PID, IPC and UTS namespaces and
  runs programs as a fresh random uid (_launcher.py).
- "bwrap": bubblewrap, unprivileged user namespaces: the launcher runs inside `bwrap` (new user,
  mount, network, PID, IPC, UTS and cgroup namespaces, no further user namespaces, all capabilities
  dropped, a read-only root of the system and Python directories, a tmpfs /sandbox).
- "remote": a SandboxFusion-compatible HTTP service (remote.py); programs never run on this machine.
Unsafe levels, used only with `allow_unsandboxed=True`: "uid" (root without namespaces: a fresh uid,
limits) and "rlimits" (limits only, as the calling user).
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BACKENDS = ("namespaces", "bwrap", "remote")
URL_VARIABLE = "GRPO_FAST_SANDBOX_URL"
_LAUNCHER_SOURCE = Path(__file__).with_name("_launcher.py").read_text(encoding="utf-8")
_SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin", "/etc")
ROOT_MOUNT = "/run/grpo-fast-sandbox"
"""Where the namespaces backend mounts each sandbox's root, in the sandbox's own mount namespace only
(one empty root-owned directory for all sandboxes; nothing is ever written there on the host)."""


@dataclass(frozen=True)
class SandboxConfig:
    """backend: "auto" | "namespaces" | "bwrap" | "remote". url: the remote service's base URL (auto
    also picks remote when it is set; default: the GRPO_FAST_SANDBOX_URL environment variable).
    timeout_s: seconds one remote request may take beyond the run's own time limit; retries: attempts
    after a failed remote request (connection errors, HTTP 5xx, SandboxError), with backoff."""

    backend: str = "auto"
    url: str | None = None
    timeout_s: float = 30.0
    retries: int = 3

    def __post_init__(self) -> None:
        if self.backend not in ("auto", *BACKENDS):
            raise ValueError(f"sandbox.backend: expected one of {('auto', *BACKENDS)}, got {self.backend!r}")
        if self.backend == "remote" and not self.url:
            raise ValueError(f"sandbox.url: the remote backend needs a URL (or the {URL_VARIABLE} variable)")
        if self.timeout_s <= 0 or self.retries < 0:
            raise ValueError(f"sandbox: timeout_s must be > 0 and retries >= 0, got {self.timeout_s}, {self.retries}")

    @classmethod
    def of(cls, spec: SandboxConfig | Mapping[str, Any] | str | None) -> SandboxConfig:
        """A config from a backend name, a mapping of the fields (as YAML gives them), or None (auto)."""
        if isinstance(spec, SandboxConfig):
            return spec
        options = {"backend": spec} if isinstance(spec, str) else dict(spec or {})
        unknown = sorted(set(options) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"sandbox: unknown option(s) {unknown}; options: {[f.name for f in fields(cls)]}")
        options.setdefault("url", os.environ.get(URL_VARIABLE) or None)
        return cls(**options)


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

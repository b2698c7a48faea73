"""One control group per sandbox: memory, process and CPU limits for the sandbox as a whole.

Resource limits (RLIMIT_AS, RLIMIT_NPROC) bind each process: a program that forks n processes can
hold n times the memory limit. A control group bounds the sum, and kills everything in it at once.

Where: under a parent group this process may create groups in (root: its own group; any user: a group
delegated to it, e.g. by systemd's Delegate=yes or a container's, named by its path as /proc/self/cgroup
writes it or relative to this process's own group, `SandboxConfig.cgroup`); every limit already set on the parent
still holds:
- cgroup v2: the parent must accept controllers for children (`+memory +pids +cpu` written to its
  cgroup.subtree_control; the kernel refuses that in a group that holds processes, unless it is the
  root of the hierarchy). Limits: memory.max, memory.swap.max = 0, pids.max, cpu.max.
- cgroup v1: the memory and pids hierarchies, where mounted and writable at the parent's path. Limits:
  memory.limit_in_bytes (and memsw where swap accounting exists), pids.max; no CPU share.
Elsewhere `parents` says why not, `Cgroup.create` returns None and a sandbox is bounded per process only
(isolation.choose refuses that unless the config allows it).

Groups are named grpo-sandbox-<pid of the creating process>-<random>; `sweep()` removes those
left by processes that died before removing them.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_PREFIX = "grpo-sandbox-"


def _own_paths() -> dict[str, str]:
    """{hierarchy: this process's group path}: "" for cgroup v2, controller names for v1."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def _mounts() -> dict[str, str]:
    """{"": the cgroup2 mount, controller: its v1 mount} from /proc/self/mountinfo."""
    found: dict[str, str] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        dash = fields.index("-")
        root, point, fstype, options = fields[3], fields[4], fields[dash + 1], fields[dash + 3]
        if root != "/":
            continue  # a bind of part of a hierarchy: group paths would not line up
        if fstype == "cgroup2":
            found.setdefault("", point)
        elif fstype == "cgroup":
            for name in options.split(","):
                if name in ("memory", "pids"):
                    found.setdefault(name, point)
    return found


@dataclass(frozen=True)
class Parents:
    """Where a sandbox's groups go: `version` "v2" or "v1" and {hierarchy: parent directory} ("" for v2,
    "memory" and "pids" for v1); `version` None and `why` where no group can be made."""

    version: str | None
    dirs: dict[str, Path]
    why: str = ""

    def __bool__(self) -> bool:
        return self.version is not None

    def text(self) -> str:
        """One line for the start-up status: what bounds a sandbox's memory."""
        if not self:
            return f"memory bounded per process only ({self.why})"
        where = next(iter(self.dirs.values()))
        return f"memory and processes bounded per sandbox (cgroup {self.version}, under {where})"


@functools.cache
def parents(path: str | None = None) -> Parents:
    """Where new groups go under the group `path` (as /proc/self/cgroup names it, or relative to this process's own
    group in each hierarchy; None: this process's own)."""
    try:
        own, mounts = _own_paths(), _mounts()
    except (OSError, ValueError) as exc:
        return Parents(None, {}, f"no control groups here: {exc}")
    if "memory" in mounts and "pids" in mounts and "memory" in own and "pids" in own:
        dirs = {name: Path(mounts[name] + _joined(own[name], path)) for name in ("memory", "pids")}
        if all(os.access(d, os.W_OK) for d in dirs.values()):
            return Parents("v1", dirs)
        why = f"cgroup v1: {' and '.join(map(str, dirs.values()))} not writable by uid {os.geteuid()}"
    else:
        why = "no cgroup v1 memory and pids hierarchies"
    if "" in mounts and "" in own:
        parent = Path(mounts[""] + _joined(own[""], path))
        try:
            available = set((parent / "cgroup.controllers").read_text().split())
            if {"memory", "pids"} <= available:
                wanted = " ".join(f"+{c}" for c in ("memory", "pids", "cpu") if c in available)
                (parent / "cgroup.subtree_control").write_text(wanted)
                return Parents("v2", {"": parent})
            why += f"; cgroup v2 at {parent} has no memory and pids controllers"
        except OSError as exc:
            why += f"; cgroup v2 at {parent} does not take child groups ({exc.strerror})"
    log.warning("sandbox: no control group can be created (%s): a sandbox's memory is bounded per process only", why)
    return Parents(None, {}, why)


def _joined(own: str, path: str | None) -> str:
    """The group `path` names: itself when absolute, else relative to this process's own group `own`."""
    if path is None:
        return own
    return path if path.startswith("/") else f"{own.rstrip('/')}/{path}"


class Cgroup:
    """One sandbox's group in each hierarchy (see module doc)."""

    def __init__(self, version: str, dirs: dict[str, Path]) -> None:
        self.version, self.dirs = version, dirs

    @classmethod
    def create(cls, memory_bytes: int, pids: int, cpus: float = 1.0, parent: str | None = None) -> Cgroup | None:
        """A new group with these limits under `parent` (see `parents`), or None where groups cannot be made."""
        found = parents(parent)
        if not found:
            return None
        version, bases = found.version, found.dirs
        name = f"{_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        group = cls(version, {h: base / name for h, base in bases.items()})
        try:
            for path in group.dirs.values():
                path.mkdir()
            if version == "v2":
                d = group.dirs[""]
                _write(d / "memory.max", memory_bytes)
                _write(d / "memory.swap.max", 0, optional=True)
                _write(d / "pids.max", pids)
                _write(d / "cpu.max", f"{int(cpus * 100_000)} 100000", optional=True)
            else:
                _write(group.dirs["memory"] / "memory.limit_in_bytes", memory_bytes)
                _write(group.dirs["memory"] / "memory.memsw.limit_in_bytes", memory_bytes, optional=True)
                _write(group.dirs["pids"] / "pids.max", pids)
        except OSError:
            group.remove()
            raise
        return group

    def add(self, pid: int) -> None:
        """Move process `pid` (and what it starts later) into the group."""
        for path in self.procs_files():
            _write(Path(path), pid)

    def procs_files(self) -> list[str]:
        """The files a process writes its pid to, to join the group (one per hierarchy)."""
        return [str(path / "cgroup.procs") for path in self.dirs.values()]

    def pids(self) -> list[int]:
        path = next(iter(self.dirs.values()))
        try:
            return [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill(self, patience_s: float = 5.0) -> bool:
        """SIGKILL every process in the group, until it is empty or `patience_s` passed: whether it is."""
        if self.version == "v2" and (self.dirs[""] / "cgroup.kill").exists():
            _write(self.dirs[""] / "cgroup.kill", 1, optional=True)
        end = time.monotonic() + patience_s
        while True:
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() >= end:
                return False
            time.sleep(0.002)

    def remove(self, wait: bool = True) -> bool:
        """Kill what is left and delete the group's directories: whether they are gone (without `wait`,
        one attempt: a group whose processes are still exiting stays for a later call)."""
        if not self.kill(5.0 if wait else 0.0):
            return False
        return all(_rmdir(path, attempts=200 if wait else 1) for path in self.dirs.values())


def sweep(parent: str | None = None) -> None:
    """Remove the groups under `parent` of processes that are gone (their owner died before removing them)."""
    found = parents(parent)
    for base in found.dirs.values():
        for path in base.glob(f"{_PREFIX}*"):
            owner = path.name[len(_PREFIX) :].split("-")[0]
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                Cgroup(found.version, {"": path}).remove(wait=False)


def _write(path: Path, value: object, optional: bool = False) -> None:
    try:
        path.write_text(str(value))
    except OSError:
        if not optional:
            raise


def _rmdir(path: Path, attempts: int = 200) -> bool:
    """Remove a group's directory, retrying while its last processes leave it: whether it is gone."""
    for attempt in range(attempts):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if attempt + 1 < attempts:
                time.sleep(0.005)
    if attempts > 1:
        log.warning("sandbox: control group %s could not be removed", path)
    return False

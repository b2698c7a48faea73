"""One control group per sandbox: memory, process and CPU limits for the sandbox as a whole.

Resource limits (RLIMIT_AS, RLIMIT_NPROC) bind each process: a program that forks n processes can
hold n times the memory limit. A control group bounds the sum, and kills everything in it at once.

Where (needs root, or a writable delegated hierarchy; groups are created under this process's own
group, so every limit already set on the caller still holds):
- cgroup v2: the group of this process must accept controllers for children (`+memory +pids +cpu`
  written to its cgroup.subtree_control; the kernel refuses that in a group that holds processes,
  unless it is the root of the hierarchy). Limits: memory.max, memory.swap.max = 0, pids.max, cpu.max.
- cgroup v1: the memory and pids hierarchies, where mounted and writable. Limits:
  memory.limit_in_bytes (and memsw where swap accounting exists), pids.max; no CPU share.
Elsewhere `Cgroup.create` returns None (logged once) and a sandbox is bounded per process only.

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


@functools.cache
def parents() -> tuple[str, dict[str, Path]] | None:
    """("v2" | "v1", {hierarchy: the directory new groups go in}), or None where none can be made."""
    try:
        own, mounts = _own_paths(), _mounts()
    except (OSError, ValueError):
        return None
    if "memory" in mounts and "pids" in mounts and "memory" in own and "pids" in own:
        dirs = {name: Path(mounts[name] + own[name]) for name in ("memory", "pids")}
        if all(os.access(d, os.W_OK) for d in dirs.values()):
            return "v1", dirs
    if "" in mounts and "" in own:
        parent = Path(mounts[""] + own[""])
        try:
            available = set((parent / "cgroup.controllers").read_text().split())
            if {"memory", "pids"} <= available:
                wanted = " ".join(f"+{c}" for c in ("memory", "pids", "cpu") if c in available)
                (parent / "cgroup.subtree_control").write_text(wanted)
                return "v2", {"": parent}
        except OSError as exc:
            log.info("sandbox: cgroup v2 at %s does not take child groups (%s)", parent, exc)
    log.warning(
        "sandbox: no control group can be created (needs root and cgroup v2 with memory and pids delegable to "
        "this process's group, or cgroup v1 memory and pids): a sandbox's memory is bounded per process only "
        "(worst case: nproc x memory_bytes)"
    )
    return None


class Cgroup:
    """One sandbox's group in each hierarchy (see module doc)."""

    def __init__(self, version: str, dirs: dict[str, Path]) -> None:
        self.version, self.dirs = version, dirs

    @classmethod
    def create(cls, memory_bytes: int, pids: int, cpus: float = 1.0) -> Cgroup | None:
        """A new group with these limits, or None where groups cannot be made (see module doc)."""
        found = parents()
        if found is None:
            return None
        version, bases = found
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


def sweep() -> None:
    """Remove the groups of processes that are gone (their owner died before removing them)."""
    found = parents()
    if found is None:
        return
    for base in found[1].values():
        for path in base.glob(f"{_PREFIX}*"):
            owner = path.name[len(_PREFIX) :].split("-")[0]
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                Cgroup(found[0], {"": path}).remove(wait=False)


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

"""The processes a test started, and only those: what a sandbox left behind, observed on a host where other
programs (other test runs, a trainer) run sandboxes of their own at the same time.

`adopt_orphans()` makes the calling process a child subreaper, so that a process that detached itself from one of
its descendants (setsid, a double fork, its parent killed) is re-parented to it instead of the host's init and is
still found among its `descendants()`. `sandbox_processes()` is the part of those that a sandbox runs: a process in
another PID namespace than the caller's (namespaces, bwrap) or running as a sandbox uid (namespaces, uid).
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Collection
from dataclasses import dataclass

from grpo_fast.sandbox.session import SANDBOX_UIDS

_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class ProcessInfo:
    """A live process: its parent, uid, PID namespace and its pid there (1: the namespace's first process), state
    letter (R, S, T, ...), CPU seconds so far: its own (`cpu_s`) and those of the children it reaped."""

    parent: int
    uid: int
    pid_namespace: str
    namespace_pid: int
    state: str
    cpu_s: float
    reaped_cpu_s: float


def adopt_orphans() -> None:
    """Make this process a child subreaper (see module doc)."""
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _process(pid: int) -> ProcessInfo | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    utime, stime, cutime, cstime = (int(v) / tick for v in fields[11:15])
    uid, inner = int(status["Uid"].split()[0]), int(status.get("NSpid", str(pid)).split()[-1])
    return ProcessInfo(int(fields[1]), uid, namespace, inner, fields[0].decode(), utime + stime, cutime + cstime)


def descendants(root: int | None = None) -> dict[int, ProcessInfo]:
    """{pid: ProcessInfo} of every live process (zombies left out) descended from `root` (default: this one)."""
    every = {int(e): info for e in os.listdir("/proc") if e.isdigit() and (info := _process(int(e))) is not None}
    tree, frontier = {}, {root or os.getpid()}
    while frontier:
        frontier = {pid for pid, info in every.items() if info.parent in frontier and pid not in tree}
        tree |= {pid: every[pid] for pid in frontier}
    return {pid: info for pid, info in tree.items() if info.state not in ("Z", "X")}


def sandbox_processes(wait_s: float = 5.0, ignore: Collection[int] = ()) -> list[int]:
    """The descendants of this process that a sandbox runs (see module doc), but those of `ignore` (what was there
    before a test began), once they are gone or `wait_s` has passed (a sandbox that was just closed takes a moment
    to go): [] when none is left."""
    own = os.readlink("/proc/self/ns/pid")
    deadline = time.monotonic() + wait_s
    while True:
        left = sorted(
            pid
            for pid, info in descendants().items()
            if (info.pid_namespace != own or info.uid in SANDBOX_UIDS) and pid not in ignore
        )
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def sandbox_of(launcher: int) -> dict[int, ProcessInfo]:
    """The processes of the sandbox whose launcher process (Session.proc) is `launcher`: its descendants in another
    PID namespace, the namespace's first process (the launcher proper) included."""
    own = _process(launcher)
    if own is None:
        return {}
    return {pid: info for pid, info in descendants(launcher).items() if info.pid_namespace != own.pid_namespace}


def sandbox_cpu_s(launcher: int) -> float:
    """CPU seconds the programs of that sandbox have used: every process's own, but the launcher proper's (the
    namespace's first process), and what each reaped (the launcher reaps whatever is left to it)."""
    return sum(i.reaped_cpu_s + (i.cpu_s if i.namespace_pid != 1 else 0.0) for i in sandbox_of(launcher).values())

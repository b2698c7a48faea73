"""A sandbox's settings as config fields: which backend runs it (`SandboxConfig`) and what one sandbox may use
(`SandboxLimits`). Both are frozen dataclasses of `grpo_fast.config_fields` fields, checked wherever they are built
(YAML, a mapping, keywords), so `reward.sandbox` is a section of the training config like any other.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from grpo_fast.config_fields import MAX_WAIT_SECONDS, build, check_fields, option

BACKENDS = ("namespaces", "bwrap", "remote")
"""The sandbox backends, strongest first (what each bounds: docs/rewards.md, "The code sandbox")."""
URL_VARIABLE = "GRPO_FAST_SANDBOX_URL"


@dataclass(frozen=True)
class SandboxLimits:
    """What one sandbox may use (see each field's help)."""

    wall_s: float = option(
        5.0,
        "wall-clock seconds per request: a stdin/stdout run, a Python-tool call, an assert test for the program (its "
        "load and every call of the test) and again for the judge's own work on it",
        low=0,
        low_open=True,
    )
    cpu_s: int | None = option(
        None,
        "CPU seconds per process; null: ceil(wall_s) + 1 for a stdin/stdout run, ceil(completion_s) + 1 for the "
        "process that answers all of a completion's assert tests and for the Python tool's interpreter",
        low=1,
    )
    memory_bytes: int = option(
        2 << 30,
        "address space per process, and the whole sandbox's memory where a control group can be made",
        low=1,
    )
    file_bytes: int = option(16 << 20, "the largest file a process may write", low=1)
    disk_bytes: int = option(64 << 20, "size of the writable /sandbox, and of /dev/shm", low=1)
    nproc: int = option(32, "processes and threads of the sandbox", low=1)
    output_bytes: int = option(1 << 20, "stdout + stderr kept per run, and the largest answer of a call", low=1)
    completion_s: float = option(
        20.0,
        "wall-clock seconds for all of one completion's tests (the tests left when it runs out fail); keep it below "
        "the reward pool's timeout",
        low=0,
        low_open=True,
    )

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def of(cls, limits: SandboxLimits | Mapping[str, Any] | None) -> SandboxLimits:
        """Limits from themselves, a mapping of the fields (as a YAML config gives them) or None (the defaults)."""
        if isinstance(limits, Mapping):
            return build(cls, dict(limits), "limits")
        return limits or cls()

    def process_cpu_s(self, wall_s: float) -> int:
        """CPU seconds of a process whose requests take `wall_s` of wall clock in all (`cpu_s` when set)."""
        return self.cpu_s or math.ceil(wall_s) + 1


@dataclass(frozen=True)
class SandboxConfig:
    """Which backend runs a sandbox, and how to reach the remote one (see each field's help)."""

    backend: Literal["auto", "namespaces", "bwrap", "remote"] = option(
        "auto",
        "auto (the strongest available: namespaces, bwrap, then remote when a URL is set), namespaces (root), bwrap "
        "(bubblewrap, no root needed) or remote (a SandboxFusion-compatible service)",
    )
    url: str | None = option(None, f"the remote service's base URL (null: the {URL_VARIABLE} environment variable)")
    timeout_s: float = option(
        30.0,
        "seconds one remote request may take beyond the run's own time limit",
        low=0,
        low_open=True,
        high=MAX_WAIT_SECONDS,
    )
    retries: int = option(
        3, "attempts after a failed remote request (connection errors, HTTP 5xx, SandboxError), with backoff", low=0
    )
    cgroup: str | None = option(
        None,
        "the control group under which each sandbox gets a group of its own (memory, processes and CPU bounded for "
        "the whole sandbox): a path as /proc/self/cgroup names it (cgroup v2, or that path in the memory and pids "
        "hierarchies of cgroup v1), or relative to this process's own group; one this user may create groups in "
        "(root: any; otherwise one delegated to it, e.g. a systemd unit's with Delegate=yes). null: this process's "
        "own group",
    )
    allow_per_process_memory: bool = option(
        False,
        "run programs where no control group can be made (each process is then bounded alone: a program's "
        "processes may hold up to nproc x memory_bytes together; the start-up check says so); false: refuse to "
        "run them there",
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.backend == "remote" and not self.service_url:
            raise ValueError(f"url: the remote backend needs a URL (or the {URL_VARIABLE} variable)")

    @property
    def service_url(self) -> str | None:
        """The remote service's URL: `url`, else the GRPO_FAST_SANDBOX_URL environment variable."""
        return self.url or os.environ.get(URL_VARIABLE) or None

    @classmethod
    def of(cls, spec: SandboxConfig | Mapping[str, Any] | str | None) -> SandboxConfig:
        """A config from itself, a backend name, a mapping of the fields (as YAML gives them), or None (auto)."""
        if isinstance(spec, SandboxConfig):
            return spec
        if isinstance(spec, str):
            spec = {"backend": spec}
        return build(cls, dict(spec or {}), "sandbox")

"""Which sandbox backend (backends.py) runs programs here: `isolation()` is the strongest local backend this
machine allows (probed once per process by starting a real launcher); `choose(config, allow_unsandboxed)` the
backend a reward uses: the one a `SandboxConfig` names, or with "auto" the strongest available (namespaces, bwrap,
then remote when a URL is configured), else an InfrastructureError (a RuntimeError) that says what is missing and
the options. A local backend needs a control group to bound each sandbox's memory as a whole (cgroups.py), or the
config's consent to per-process bounds; `containment` says which holds. `run_sandboxed` runs programs in the
chosen local backend.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_fast.errors import InfrastructureError
from grpo_fast.sandbox import cgroups
from grpo_fast.sandbox.config import BACKENDS, URL_VARIABLE, SandboxConfig, SandboxLimits
from grpo_fast.sandbox.session import Session

log = logging.getLogger(__name__)


@functools.cache
def probe(level: str) -> str | None:
    """Why `level` cannot run here (None: it can): a real launcher is started and set up."""
    if level == "namespaces" and os.geteuid() != 0:
        return "not root"
    if level == "bwrap" and not shutil.which("bwrap"):
        return "no bwrap binary (Debian/Ubuntu: apt-get install bubblewrap)"
    try:
        Session(level, SandboxLimits(), sys.executable, {}, cgroup=False).close()
    except InfrastructureError as exc:
        return str(exc)
    return None


@functools.cache
def isolation() -> str:
    """The strongest local backend this machine allows: "namespaces", "bwrap", else "uid" (root) or
    "rlimits" (see module doc)."""
    for level in ("namespaces", "bwrap"):
        if probe(level) is None:
            return level
    return "uid" if os.geteuid() == 0 else "rlimits"


def choose(config: SandboxConfig, allow_unsandboxed: bool = False) -> str:
    """The backend programs run in under `config` (see module doc); logs the choice once. A local backend where no
    control group bounds a sandbox's memory is refused unless `config.allow_per_process_memory`."""
    if config.backend != "auto":
        reason = None if config.backend == "remote" else probe(config.backend)
        if reason is not None:
            raise InfrastructureError(f"code sandbox: backend {config.backend!r} cannot run here: {reason}")
        return _contained(config.backend, config)
    local = isolation()
    if local in BACKENDS:
        return _contained(local, config)
    if config.service_url:
        return _chosen("remote", "programs run on the service")
    if allow_unsandboxed:
        log.warning(
            "code sandbox: NO SANDBOX (level %r, allow_unsandboxed=True): programs run with access to this "
            "machine's files, processes and network. Only for trusted programs.",
            local,
        )
        return local
    raise InfrastructureError(
        "code sandbox: no backend can run untrusted programs on this machine "
        f"(namespaces: {probe('namespaces')}; bwrap: {probe('bwrap')}; remote: no URL). Options: run as root "
        "where the launcher may unshare namespaces (a container allowed to unshare, e.g. with CAP_SYS_ADMIN and "
        "no seccomp/AppArmor block); install bubblewrap where unprivileged user namespaces are enabled "
        "(apt-get install bubblewrap; sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0); "
        f"give a SandboxFusion-compatible service with sandbox={{backend: remote, url: ...}} or {URL_VARIABLE}; "
        "or pass allow_unsandboxed=True to run them anyway (UNSAFE: only for trusted programs)."
    )


def containment(backend: str, config: SandboxConfig) -> tuple[str, bool]:
    """What bounds a sandbox of `backend` under `config`, in one line for the start-up status, and whether its
    memory is bounded as a whole (a control group; the service's business for remote)."""
    if backend == "remote":
        return "programs run on the service", True
    found = cgroups.parents(config.cgroup)
    return found.text(), bool(found)


def _contained(backend: str, config: SandboxConfig) -> str:
    """`backend` (a local one), unless no control group can bound its sandboxes' memory and the config does not
    allow that."""
    found = cgroups.parents(config.cgroup)
    if not found and not config.allow_per_process_memory:
        raise InfrastructureError(
            f"code sandbox ({backend}): no control group can bound a sandbox's memory here ({found.why}), so each "
            "of a program's processes would be bounded alone (up to nproc x memory_bytes together). Give a group "
            "this user may create groups in (sandbox.cgroup: e.g. a systemd unit's with Delegate=yes), or accept "
            "per-process bounds with sandbox.allow_per_process_memory: true (then lower nproc and memory_bytes)"
        )
    return _chosen(backend, found.text())


@functools.cache
def _chosen(backend: str, bounds: str) -> str:
    log.info("code sandbox: backend %r, %s", backend, bounds)
    return backend


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
    config = SandboxConfig.of(sandbox)
    with Session(level, limits, python, files, cgroup_parent=config.cgroup) as session:
        message = {"op": "run"}
        return [session.request({**message, **run}, limits.wall_s) for run in runs]

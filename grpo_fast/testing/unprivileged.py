"""Running as a user who is not root, from a test that is root: the path of most GPU clusters (the bwrap backend),
tested on a machine where the tests run as root.

`run_as_nobody(script, *args)` runs a Python script as `nobody` (uid 65534, no groups, no capabilities) with the
system Python and this checkout on its path (the checkout's virtual environment may live where nobody cannot read),
so the script may import grpo_fast's stdlib-only parts (grpo_fast.sandbox) and print its findings.
`delegated_cgroup(uid)` gives that user a control group to create sandbox groups in, as systemd's Delegate=yes or a
container would: its path relative to the caller's own group (SandboxConfig.cgroup).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from grpo_fast.sandbox import cgroups

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
REPO = Path(__file__).resolve().parents[2]


def can_run_as_nobody() -> str | None:
    """Why `run_as_nobody` cannot work here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root, to become nobody"
    if not os.access(SYSTEM_PYTHON, os.X_OK) or shutil.which("setpriv") is None:
        return f"needs {SYSTEM_PYTHON} and setpriv"
    return None


def run_as_nobody(script: str, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess:
    """Run Python `script` (source) as nobody (see module doc); its output as text."""
    with tempfile.TemporaryDirectory(dir="/tmp") as scratch:  # pytest's tmp_path is not nobody's to read
        path = Path(scratch) / "script.py"
        path.write_text(script)
        path.chmod(0o644)
        Path(scratch).chmod(0o755)
        drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all"]
        env = {"PATH": os.defpath, "HOME": "/tmp", "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}
        return subprocess.run(
            [*drop, SYSTEM_PYTHON, str(path), *args], capture_output=True, text=True, env=env, timeout=timeout
        )


@contextlib.contextmanager
def delegated_cgroup(uid: int = NOBODY) -> Iterator[str | None]:
    """A cgroup v1 group (memory and pids) under the caller's own, owned by `uid`: its relative path, or None where
    this machine has no cgroup v1 hierarchies root may create groups in. Removed afterwards."""
    found = cgroups.parents()
    if found.version != "v1":
        yield None
        return
    name = f"grpo-delegated-{secrets.token_hex(4)}"
    made = [directory / name for directory in found.dirs.values()]
    for path in made:
        path.mkdir()
        for entry in (path, *path.iterdir()):
            os.chown(entry, uid, uid)
    try:
        yield name
    finally:
        for path in made:
            for child in sorted(path.glob("**/"), key=lambda p: len(p.parts), reverse=True):
                cgroups.Cgroup("v1", {"": child}).remove(wait=True)

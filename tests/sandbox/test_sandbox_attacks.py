"""The attack suite of grpo_fast.testing.sandbox_attacks against real sandboxes: every attack contained, judged from
the host. In CI: the strongest backend of this machine, directly and through the Python tool. Marked slow: the other
backend, and the bwrap backend run by a user who is not root (with a control group delegated to it, and without one,
where its per-process bounds are what the start-up status says)."""

from __future__ import annotations

import json

import pytest

from grpo_fast.sandbox import SandboxConfig, cgroups, isolation, probe
from grpo_fast.testing.processes import adopt_orphans
from grpo_fast.testing.sandbox_attacks import breaches, tool_breaches
from grpo_fast.testing.unprivileged import can_run_as_nobody, delegated_cgroup, run_as_nobody

adopt_orphans()
STRONGEST = isolation()
OTHER = [level for level in ("namespaces", "bwrap") if level != STRONGEST and probe(level) is None]
needs_sandbox = pytest.mark.skipif(STRONGEST not in ("namespaces", "bwrap"), reason="no local sandbox backend here")


def config(level: str) -> SandboxConfig:
    """The level, where a control group bounds a sandbox (else its per-process bounds, as the status says)."""
    return SandboxConfig(backend=level, allow_per_process_memory=not cgroups.parents())


@needs_sandbox
def test_no_attack_on_the_strongest_backend_gets_through():
    assert breaches(STRONGEST, config(STRONGEST)) == {}


@needs_sandbox
def test_no_attack_through_the_python_tool_gets_through():
    assert tool_breaches(config(STRONGEST)) == {}


@pytest.mark.slow
@pytest.mark.parametrize("level", OTHER or [pytest.param(None, marks=pytest.mark.skip("one backend here"))])
def test_no_attack_on_the_other_backend_gets_through(level):
    assert breaches(level, config(level)) == {}
    assert tool_breaches(config(level)) == {}


SUITE = "import sys\nfrom grpo_fast.testing.sandbox_attacks import main\nmain(sys.argv[1:])"


@pytest.mark.slow
@pytest.mark.skipif(can_run_as_nobody() is not None, reason=str(can_run_as_nobody()))
@pytest.mark.skipif(probe("bwrap") is not None, reason=f"bubblewrap cannot run here: {probe('bwrap')}")
def test_no_attack_gets_through_without_root():
    with delegated_cgroup() as group:
        settings = [{"backend": "bwrap", "allow_per_process_memory": True}]
        settings += [{"backend": "bwrap", "cgroup": group}] if group is not None else []
        for sandbox in settings:
            done = run_as_nobody(SUITE, "bwrap", json.dumps(sandbox), timeout=900)
            assert done.returncode == 0, done.stderr[-3000:]
            assert json.loads(done.stdout.strip().splitlines()[-1]) == {"sandbox": {}, "tool": {}}, sandbox

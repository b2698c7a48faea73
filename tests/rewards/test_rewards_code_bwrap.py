"""The bubblewrap backend: the same rewards and containment as the namespaces backend, and the code reward
working for a user who is not root (the case of most GPU clusters).

Needs the `bwrap` binary (Debian/Ubuntu: bubblewrap) and a kernel that lets users create user
namespaces; the unprivileged test also needs root here, to become `nobody`, and a system Python that
`nobody` can run.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from test_rewards_code import ADD, ADD_TESTS, sandbox_processes
from test_rewards_code_attacks import LEAKY_SETUPS, THIEF

from grpo_fast.rewards import code_tests
from grpo_fast.sandbox import probe
from grpo_fast.testing.unprivileged import can_run_as_nobody, delegated_cgroup, run_as_nobody

REPO = Path(__file__).resolve().parents[2]
LIMITS = {"wall_s": 2.0, "memory_bytes": 1 << 30}
pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or probe("bwrap") is not None,
    reason=f"bubblewrap cannot run here: {probe('bwrap') if shutil.which('bwrap') else 'no bwrap binary'}",
)


def bwrap(programs: list[str], tests: list) -> list:
    return code_tests(["p"] * len(programs), programs, [tests] * len(programs), limits=LIMITS, sandbox="bwrap")


def test_bwrap_scores_programs_and_keeps_expected_values_out():
    assert bwrap([ADD, "def add(a, b):\n    return abs(a) + b\n"], ADD_TESTS) == [1.0, pytest.approx(2 / 3)]
    assert bwrap(["print(sum(map(int, input().split())))"], [{"input": "2 3", "output": "5"}]) == [1.0]
    for tests in LEAKY_SETUPS.values():
        assert bwrap([THIEF], tests) == [0.0]


def test_bwrap_contains_hostile_programs(tmp_path):
    target = tmp_path / "escape.txt"
    tmp_path.chmod(0o777)
    hostile = f"""
import os, socket, subprocess
for action in (
    lambda: open({str(target)!r}, "w").write("x"),
    lambda: socket.create_connection(("127.0.0.1", 22), timeout=1),
    lambda: subprocess.Popen(["sleep", "60"], start_new_session=True),
):
    try:
        action()
    except Exception:
        pass
def add(a, b):
    return socket.gethostname()
"""
    assert bwrap([hostile], ADD_TESTS) == [0.0]
    assert not target.exists()
    assert sandbox_processes() == []  # the sleep daemon included: it is this process's descendant while it lives


UNPRIVILEGED = """
import json, os, sys
from grpo_fast.rewards.code import code_tests
from grpo_fast.sandbox import isolation
secret, sandbox = sys.argv[1], json.loads(sys.argv[2])
hunter = (
    "import glob\\nfound = ''\\n"
    "for path in glob.glob('/home/*/*') + glob.glob('/root/*') + [%r]:\\n"
    "    try:\\n        found = found or open(path).read()\\n    except OSError:\\n        pass\\n"
    "def add(a, b):\\n    return found\\n"
) % secret
try:
    rewards = code_tests(
        ["p"] * 3,
        ["def add(a, b):\\n    return a + b\\n", "def add(a, b):\\n    return a - b\\n", hunter],
        [["assert add(1, 2) == 3", "assert add(2, 2) == 4"]] * 3,
        limits={"wall_s": 5.0, "memory_bytes": 1 << 30},
        sandbox=sandbox,
    )
except Exception as exc:
    rewards = f"{type(exc).__name__}: {exc}"
print(json.dumps({"uid": os.geteuid(), "isolation": isolation(), "rewards": rewards}))
"""


@pytest.mark.skipif(can_run_as_nobody() is not None, reason=str(can_run_as_nobody()))
def test_the_code_reward_works_without_root():
    """The scorer runs as `nobody` (no capabilities, no namespaces of its own): it picks bwrap, scores right, and a
    program cannot read a file that `nobody` can read outside the sandbox. Without a control group it refuses to
    run programs bounded per process only, unless the config allows that; with one delegated to it, it runs them
    in it."""
    with tempfile.TemporaryDirectory(dir="/tmp") as scratch, delegated_cgroup() as group:
        secret = Path(scratch) / "secret.txt"
        secret.write_text(f"SECRET-{uuid.uuid4().hex}")
        secret.chmod(0o644)
        Path(scratch).chmod(0o755)
        refused = _score_as_nobody(secret, {})
        assert refused["rewards"].startswith("InfrastructureError: code sandbox (bwrap): no control group can bound")
        assert "sandbox.allow_per_process_memory" in refused["rewards"]
        allowed = _score_as_nobody(secret, {"allow_per_process_memory": True})
        assert allowed == {"uid": 65534, "isolation": "bwrap", "rewards": [1.0, 0.0, 0.0]}
        if group is not None:
            assert _score_as_nobody(secret, {"cgroup": group})["rewards"] == [1.0, 0.0, 0.0]


def _score_as_nobody(secret: Path, sandbox: dict) -> dict:
    done = run_as_nobody(UNPRIVILEGED, str(secret), json.dumps(sandbox), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])

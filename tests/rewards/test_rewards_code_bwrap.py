"""The bubblewrap backend: the same rewards and containment as the namespaces backend, and the code reward
working for a user who is not root (the case of most GPU clusters).

Needs the `bwrap` binary (Debian/Ubuntu: bubblewrap) and a kernel that lets users create user
namespaces; the unprivileged test also needs root here, to become `nobody`, and a system Python that
`nobody` can run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from test_rewards_code import ADD, ADD_TESTS, sandbox_processes
from test_rewards_code_attacks import LEAKY_SETUPS, THIEF

from grpo_fast.rewards import code_tests
from grpo_fast.sandbox import probe

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
    assert sandbox_processes() == []
    assert not any(b"sleep\x0060" in p.read_bytes() for p in Path("/proc").glob("[0-9]*/cmdline") if _readable(p))


def _readable(path: Path) -> bool:
    try:
        path.read_bytes()
    except OSError:
        return False
    return True


UNPRIVILEGED = """
import json, os, sys
from grpo_fast.rewards.code import code_tests
from grpo_fast.sandbox import isolation
secret = sys.argv[1]
hunter = (
    "import glob\\nfound = ''\\n"
    "for path in glob.glob('/home/*/*') + glob.glob('/root/*') + [%r]:\\n"
    "    try:\\n        found = found or open(path).read()\\n    except OSError:\\n        pass\\n"
    "def add(a, b):\\n    return found\\n"
) % secret
rewards = code_tests(
    ["p"] * 3,
    ["def add(a, b):\\n    return a + b\\n", "def add(a, b):\\n    return a - b\\n", hunter],
    [["assert add(1, 2) == 3", "assert add(2, 2) == 4"]] * 3,
    limits={"wall_s": 5.0, "memory_bytes": 1 << 30},
)
print(json.dumps({"uid": os.geteuid(), "isolation": isolation(), "rewards": rewards}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run the scorer as the unprivileged user nobody")
@pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK), reason="needs a system Python at /usr/bin/python3")
def test_the_code_reward_works_without_root():
    """The scorer runs as `nobody` (no capabilities, no namespaces of its own): it picks bwrap, scores
    right, and a program cannot read a file that `nobody` can read outside the sandbox."""
    with tempfile.TemporaryDirectory(dir="/tmp") as scratch:  # pytest's tmp_path is not nobody's to read
        _score_as_nobody(Path(scratch))


def _score_as_nobody(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text(f"SECRET-{uuid.uuid4().hex}")
    secret.chmod(0o644)
    script = tmp_path / "score.py"
    script.write_text(UNPRIVILEGED)
    script.chmod(0o644)
    tmp_path.chmod(0o755)
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]
    env = {"PATH": os.defpath, "HOME": "/tmp", "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}
    done = subprocess.run(
        [*drop, "/usr/bin/python3", str(script), str(secret)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"uid": 65534, "isolation": "bwrap", "rewards": [1.0, 0.0, 0.0]}

"""`grpo-fast train` in a subprocess of its own, as a user runs it, for the tests that kill a run and resume it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def train_in_subprocess(
    config: Path,
    out: Path,
    *,
    import_dir: Path,
    kill: str | None = None,
    resume: bool = False,
    overrides: Sequence[str] = (),
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """`grpo-fast train --config config --skip-checks` writing to `out` (plus `--resume` and `--set` each of
    `overrides`), one thread per math library, with `import_dir` on its PYTHONPATH (the modules the config names:
    rewards, tools, the kill points). `kill`: the GRPO_TEST_KILL point ("<phase>:<n>") at which the run kills
    itself; none inherited from this process. Its output is captured as text."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(import_dir), os.environ.get("PYTHONPATH", "")])}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("GRPO_TEST_KILL", None)
    if kill:
        env["GRPO_TEST_KILL"] = kill
    cmd = [sys.executable, "-c", "import sys; from grpo_fast.cli import main; sys.exit(main(sys.argv[1:]))"]
    cmd += ["train", "--config", str(config), "--skip-checks", "--set", f"run.output_dir={out}"]
    cmd += ["--resume"] if resume else []
    for override in overrides:
        cmd += ["--set", override]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)

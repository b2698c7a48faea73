"""The machine and the code a result is measured on, for the stamps of benchmark and fuzz results."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(root: Path = REPO_ROOT) -> str:
    """HEAD's short hash, with "+dirty" when tracked files differ from it (see `changed_files`); without git (a
    copy of the working tree on another machine) the GRPO_FAST_COMMIT environment variable, else "unknown"."""
    try:
        return _git(root, "rev-parse", "--short", "HEAD") + ("+dirty" if changed_files(root) else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("GRPO_FAST_COMMIT", "unknown")


def changed_files(root: Path = REPO_ROOT) -> list[str]:
    """The tracked files of the tree at `root` that differ from its HEAD, but the benchmarks' own results: a queue
    of benchmarks writes them as it goes, and they are not the code measured."""
    return _git(root, "diff", "--name-only", "HEAD", "--", ".", ":(exclude)benchmarks/results").splitlines()


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=root, check=True).stdout.strip()

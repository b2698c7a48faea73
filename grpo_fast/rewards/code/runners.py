"""Language runners for stdin/stdout code tests: how a program becomes files and a command line.

A runner is anything with `files(program) -> {name: text}` (written into the sandbox's working
directory) and `command() -> argv` (run there once per test, with the test input on stdin). Commands
run inside the sandbox, so they may only use interpreters and compilers under the system and Python
directories it shows. Compiled languages can compile and run in one command, e.g.
`["/bin/sh", "-c", "cc -O2 -o main main.c && ./main"]`. For the remote backend a runner also names
its `remote_language` (SandboxFusion's: "python", "bash", "cpp", ...), and the program is its first
file. Assert tests always use the Python call runner (`call_runner.py`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Protocol


class Runner(Protocol):
    """A language runner (see module doc)."""

    def files(self, program: str) -> dict[str, str]: ...

    def command(self) -> list[str]: ...


@dataclass(frozen=True)
class PythonRunner:
    """Runs `solution.py` with `python` in isolated mode (-I: no user site, no PYTHON* variables)."""

    python: str = sys.executable
    remote_language = "python"

    def files(self, program: str) -> dict[str, str]:
        return {"solution.py": program}

    def command(self) -> list[str]:
        return [self.python, "-I", "solution.py"]


@dataclass(frozen=True)
class ShellRunner:
    """Runs `solution.sh` with /bin/sh (a second language, to keep the protocol honest)."""

    shell: str = "/bin/sh"
    remote_language = "bash"

    def files(self, program: str) -> dict[str, str]:
        return {"solution.sh": program}

    def command(self) -> list[str]:
        return [self.shell, "solution.sh"]

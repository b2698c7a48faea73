"""Code rewards: run a completion's program against hidden tests in a sandbox (see sandbox.py)."""

from grpo_fast.rewards.code.reward import code_tests, extract_code
from grpo_fast.rewards.code.runners import PythonRunner, Runner, ShellRunner
from grpo_fast.rewards.code.sandbox import SandboxLimits, isolation, run_sandboxed

__all__ = [
    "PythonRunner",
    "Runner",
    "SandboxLimits",
    "ShellRunner",
    "code_tests",
    "extract_code",
    "isolation",
    "run_sandboxed",
]

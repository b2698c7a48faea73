"""Code rewards: run a completion's program against hidden tests in a sandbox (see reward.py, isolation.py)."""

from grpo_fast.rewards.code.backends import SandboxConfig
from grpo_fast.rewards.code.isolation import isolation, run_sandboxed
from grpo_fast.rewards.code.reward import code_tests, extract_code
from grpo_fast.rewards.code.runners import PythonRunner, Runner, ShellRunner
from grpo_fast.rewards.code.sandbox import SandboxLimits

__all__ = [
    "PythonRunner",
    "Runner",
    "SandboxConfig",
    "SandboxLimits",
    "ShellRunner",
    "code_tests",
    "extract_code",
    "isolation",
    "run_sandboxed",
]

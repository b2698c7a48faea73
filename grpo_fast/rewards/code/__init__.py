"""Code rewards: run a completion's program against hidden tests in the code sandbox (reward.py; the sandbox:
grpo_fast.sandbox)."""

from grpo_fast.rewards.code.reward import code_tests, extract_code
from grpo_fast.rewards.code.runners import PythonRunner, Runner, ShellRunner
from grpo_fast.sandbox import SandboxConfig, SandboxLimits

__all__ = ["PythonRunner", "Runner", "SandboxConfig", "SandboxLimits", "ShellRunner", "code_tests", "extract_code"]

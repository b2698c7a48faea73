"""The code sandbox: untrusted programs run on this machine under limits, isolated from it and from each other.

The interface, for code rewards (grpo_fast.rewards.code) and the Python tool (grpo_fast.rollout.python_tool):

- choose the backend: `choose(SandboxConfig, allow_unsandboxed)` (the strongest local one under "auto", checked
  once per process by starting a real sandbox: `isolation()`, `probe(level)`; what bounds its sandboxes:
  `containment`);
- start a sandbox with limits: `Session(level, SandboxLimits, python, files, cpu_s=...)`;
- run in it: `Session.request` (a stdin/stdout run, a server started, a line asked of it, files written), or
  `post` now and `collect` the answer later;
- release it: `Session.close()`; `reap()` finishes the teardown of closed sandboxes.

What each backend bounds and what it exposes: docs/rewards.md, "The code sandbox".
"""

from grpo_fast.sandbox.backends import RUNNER_CHANNEL, runner_argv
from grpo_fast.sandbox.config import BACKENDS, URL_VARIABLE, SandboxConfig, SandboxLimits
from grpo_fast.sandbox.isolation import choose, containment, isolation, probe, run_sandboxed
from grpo_fast.sandbox.session import Session, reap

__all__ = [
    "BACKENDS",
    "URL_VARIABLE",
    "SandboxConfig",
    "SandboxLimits",
    "Session",
    "choose",
    "containment",
    "isolation",
    "probe",
    "reap",
    "run_sandboxed",
    "RUNNER_CHANNEL",
    "runner_argv",
]

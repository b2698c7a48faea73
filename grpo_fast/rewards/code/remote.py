"""The "remote" backend: programs run on a SandboxFusion-compatible code-execution service.

API (SandboxFusion's, as verl uses it): POST {url}/run_code with JSON {"code", "language", "stdin",
"run_timeout", "compile_timeout", "files": {path: base64}} answers {"status": "Success" | "Failed" |
"SandboxError", "message", "run_result": {"status": "Finished" | "TimeLimitExceeded" | "Error",
"return_code", "stdout", "stderr", ...}}. Connection errors, HTTP errors, "SandboxError" and answers
that are not that JSON are retried `retries` times with backoff (0.5 s, 1 s, 2 s, ...), then raise
InfrastructureError: the completion did not cause them.

Same result protocol as the local backends:
- stdin/stdout tests: one request per test, the program as `code` in the runner's `remote_language`;
- assert tests: the program as file solution.py and, as `code`, the call runner in batch mode
  (call_runner.py) with the test's requests so far on stdin. The service keeps nothing between
  requests, so each request of a test replays the earlier ones (a fresh program, as the local call
  runner gives each test) and the last answer line is the new request's answer: a test with k calls
  costs k requests. The judge runs on this machine (programs.Judge), in the strongest local sandbox,
  or as a plain process where there is none: it only runs the tests' own code on plain data.
Everything the service returns is bounded (`max_bytes`) and read as data.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from grpo_fast.errors import InfrastructureError
from grpo_fast.rewards.code.programs import CALL_RUNNER
from grpo_fast.sandbox import SandboxConfig

log = logging.getLogger(__name__)

_BATCH_RUNNER = "_BATCH = True\n" + CALL_RUNNER
_RETRYABLE_HTTP = {408, 429, 500, 502, 503, 504}


class RemoteService:
    """A client of one service (see module doc)."""

    def __init__(self, config: SandboxConfig, max_bytes: int) -> None:
        self.url = config.service_url.rstrip("/") + "/run_code"
        self.timeout_s, self.retries, self.max_bytes = config.timeout_s, config.retries, max_bytes

    def run(
        self, code: str, language: str, stdin: str, run_timeout: float, files: Mapping[str, str] | None = None
    ) -> dict:
        """The service's run_result of one request as {"exit", "timed_out", "stdout", "stderr"}."""
        body = {
            "code": code,
            "language": language,
            "stdin": stdin,
            "run_timeout": run_timeout,
            "compile_timeout": run_timeout,
            "files": {name: base64.b64encode(text.encode()).decode() for name, text in (files or {}).items()},
        }
        problem = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
            try:
                answer = self._post(body, run_timeout + self.timeout_s)
            except (OSError, ValueError, RecursionError) as exc:  # URLError, timeouts, HTTP errors, bad JSON
                problem = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, urllib.error.HTTPError) and exc.code not in _RETRYABLE_HTTP:
                    break
                continue
            if not isinstance(answer, dict) or answer.get("status") == "SandboxError":
                problem = f"the service failed: {str(answer)[:300]}"
                continue
            result = answer.get("run_result") or answer.get("compile_result") or {}
            if not isinstance(result, dict):
                problem = f"no run result: {str(answer)[:300]}"
                continue
            return {
                "exit": result.get("return_code"),
                "timed_out": result.get("status") == "TimeLimitExceeded",
                "stdout": str(result.get("stdout") or ""),
                "stderr": str(result.get("stderr") or "")[-4000:],
            }
        raise InfrastructureError(f"remote sandbox {self.url}: {problem} (after {self.retries + 1} attempts)")

    def _post(self, body: dict, timeout: float) -> Any:
        request = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = response.read(self.max_bytes + 1)
        if len(data) > self.max_bytes:
            raise ValueError(f"answer larger than {self.max_bytes} bytes")
        return json.loads(data)


class RemoteProgram:
    """A completion's program on the service: stdin/stdout runs and replayed assert-test requests."""

    def __init__(self, service: RemoteService, program: str, language: str) -> None:
        self.service, self.program, self.language = service, program, language
        self.lines: list[str] = []

    def run(self, stdin: str, timeout: float) -> dict[str, Any]:
        result = self.service.run(self.program, self.language, stdin, timeout)
        result["output_exceeded"] = len(result["stdout"]) > self.service.max_bytes // 8
        return result

    def ask(self, line: str, timeout: float) -> tuple[str | None, str | None]:
        request = json.loads(line)
        if request.get("fresh"):
            self.lines = []
        self.lines.append(line)
        if request.get("op") == "load":  # replayed with the test's next request: no request of its own
            return '{"loaded": true}', None
        stdin = "".join(request + "\n" for request in self.lines)
        result = self.service.run(_BATCH_RUNNER, "python", stdin, timeout, {"solution.py": self.program})
        if result["timed_out"]:
            return None, "no answer (timeout)"
        answers = result["stdout"].splitlines()
        if len(answers) < 2:  # the hello line, then one answer per request
            return None, f"no answer (exit {result['exit']}): {result['stderr'][-300:]}"
        return answers[-1], None

    def close(self) -> None:
        self.lines = []

"""A local stand-in for a SandboxFusion service (POST /run_code), for the remote backend's tests.

    python sandbox_fusion_stub.py PORT_FILE [--fail-first N] [--sandbox-error-first N]

Serves on 127.0.0.1 (an ephemeral port, written to PORT_FILE once listening). Each request runs its
`code` with this interpreter (language "python") or /bin/sh ("bash") in a fresh temporary directory
holding its `files`, with its `stdin`, killed after `run_timeout`; it answers SandboxFusion's JSON.
The first N requests can fail with HTTP 503 (--fail-first) or with status "SandboxError"
(--sandbox-error-first), as an overloaded service does. Programs run without a sandbox: the tests
that use it send benign ones.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_COMMANDS = {"python": [sys.executable, "-I"], "bash": ["/bin/sh"]}


def run(request: dict) -> dict:
    command = _COMMANDS.get(request.get("language"))
    if command is None:
        return {"status": "SandboxError", "message": f"unknown language {request.get('language')!r}"}
    with tempfile.TemporaryDirectory() as workdir:
        for name, data in (request.get("files") or {}).items():
            (Path(workdir) / name).write_bytes(base64.b64decode(data))
        (Path(workdir) / "main").write_text(request["code"])
        start = time.monotonic()
        try:
            done = subprocess.run(
                [*command, "main"],
                input=(request.get("stdin") or "").encode(),
                capture_output=True,
                cwd=workdir,
                timeout=float(request.get("run_timeout", 10)),
            )
            result = {"status": "Finished", "return_code": done.returncode}
            out, err = done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            result = {"status": "TimeLimitExceeded", "return_code": None}
            out, err = exc.stdout or b"", exc.stderr or b""
    result |= {
        "execution_time": time.monotonic() - start,
        "stdout": out.decode(errors="replace"),
        "stderr": err.decode(errors="replace"),
    }
    status = "Success" if result["status"] == "Finished" and result["return_code"] == 0 else "Failed"
    return {"status": status, "message": "", "compile_result": None, "run_result": result, "files": {}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port_file")
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--sandbox-error-first", type=int, default=0)
    args = parser.parse_args()
    failures = {"http": args.fail_first, "sandbox": args.sandbox_error_first}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                kind = next((k for k, left in failures.items() if left > 0), None)
                if kind is not None:
                    failures[kind] -= 1
            if self.path != "/run_code" or kind == "http":
                self.send_error(404 if self.path != "/run_code" else 503)
                return
            answer = {"status": "SandboxError", "message": "busy"} if kind == "sandbox" else run(body)
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Path(args.port_file).write_text(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()

"""Probe runner: the candidate's Python interpreter in the sandbox, for assert-style tests.

Started by the launcher as `python -I probe_runner.py solution.py` (unprivileged, in the sandbox).
It keeps private references to what it needs, loads the program as module `solution` (so an
`if __name__ == "__main__":` block does not run), says {"loaded": true} on fd 3, then answers probes
read one JSON line at a time from fd 4: {"setup": statements, "expr": expression, "truth": bool}.
The answer is {"ok": true, "value": repr(value)} (repr(bool(value)) when "truth"), or
{"ok": false, "error": "..."} when the probe raises.

The runner is not trusted: the program runs in the same interpreter and can subvert it. What keeps
the reward honest is that probes carry only the left-hand side of a test; the expected value stays
with the caller outside the sandbox, which compares `ast.literal_eval(value)` with it.
"""

import json
import os
import sys

_read, _write, _loads, _dumps, _repr, _bool = os.read, os.write, json.loads, json.dumps, repr, bool
_exec, _eval, _compile, _str = exec, eval, compile, str


def _send(message):
    _write(3, (_dumps(message) + "\n").encode())


def _receive():
    data = b""
    while not data.endswith(b"\n"):
        chunk = _read(4, 65536)
        if not chunk:
            return None
        data += chunk
    return _loads(data)


def main():
    path = sys.argv[1]
    with open(path, encoding="utf-8") as f:
        code = _compile(f.read(), path, "exec")
    namespace = {"__name__": "solution", "__file__": path, "__builtins__": __builtins__}
    sys.argv = [path]
    _exec(code, namespace)
    _send({"loaded": True})
    while True:
        probe = _receive()
        if probe is None:
            return
        try:
            if probe["setup"]:
                _exec(_compile(probe["setup"], "<test>", "exec"), namespace)
            value = _eval(_compile(probe["expr"], "<test>", "eval"), namespace)
            _send({"ok": True, "value": _repr(_bool(value) if probe["truth"] else value)})
        except BaseException as exc:  # noqa: BLE001 - a probe's SystemExit is a failed test, not the end
            _send({"ok": False, "value": None, "error": f"{type(exc).__name__}: {_str(exc)[:500]}"})


main()

"""Probe runner: evaluates a test's probes in the sandbox, in the interpreter that loaded the program
(or, with an empty program, in a clean interpreter for the test's own setup).

Started by the launcher as `python -I -c <this source> solution.py`, unprivileged, in the sandbox.
1. stdin holds one line: the number of the file descriptor of its channel to the launcher (a socket,
   at a random number); after it stdin is at end of file, as for any program without input.
2. It loads the program as module `solution` (so an `if __name__ == "__main__":` block does not run)
   and writes {"loaded": true} on the channel.
3. For each probe line {"token": t, "fresh": bool, "steps": [{"run": statements, "items": [item, ...]}]}
   it runs each step's statements, then evaluates the step's items, in order, in the program's
   namespace (a copy of it when "fresh"), and answers one line {"token": t, "values": [repr or null,
   ...]} (one per item), or {"token": t, "error": "..."} when a statement or an item raises.
   An item is {"expr": expression}, or a fallback {"expr": ..., "unless_plain": [i, ...]}: evaluated
   (with `__v` the values of the items so far, and `math`) only when one of items i is not a plain
   literal; its failure or skip answers null.

The runner is not trusted: the program shares its interpreter and can subvert it (find the channel,
read the probes, write answers). The launcher accepts only one answer per probe, carrying the token
of that probe, issued after the program loaded; the caller reads each value back as a literal and
judges the test outside (plan.py, judge.py).
"""

import json
import math
import os
import sys

_read, _write, _loads, _dumps, _repr, _type, _str = os.read, os.write, json.loads, json.dumps, repr, type, str
_exec, _eval, _compile, _all, _isfinite, _BaseException = exec, eval, compile, all, math.isfinite, BaseException
_SCALARS = (int, str, bytes, bool, type(None))


def _plain(value):
    """Whether repr(value) reads back as the same literal outside (exact builtin types only)."""
    kind = _type(value)
    if kind in _SCALARS:
        return True
    if kind is float:
        return _isfinite(value)
    if kind is complex:
        return _isfinite(value.real) and _isfinite(value.imag)
    if kind is dict:
        return _all(_plain(k) and _plain(v) for k, v in value.items())
    if kind in (list, tuple, set):
        return _all(_plain(v) for v in value)
    return False


class _Channel:
    """Lines of JSON on the channel socket."""

    def __init__(self, fd):
        self.fd, self.buffer = fd, b""

    def send(self, message):
        data = (_dumps(message) + "\n").encode()
        while data:
            data = data[_write(self.fd, data) :]

    def receive(self):
        while b"\n" not in self.buffer:
            chunk = _read(self.fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return _loads(line)


def _item(item, scope, values):
    """(value, repr) of one item; (None, None) for a skipped or failed fallback."""
    code = _compile(item["expr"], "<test>", "eval")
    deps = item.get("unless_plain")
    if deps is None:
        value = _eval(code, scope)
        return value, _repr(value)
    if _all(_plain(values[i]) for i in deps):
        return None, None
    try:
        value = _eval(code, scope, {"__v": values, "math": math})
        return value, _repr(value)
    except _BaseException:  # noqa: BLE001 - a fallback that fails only leaves its value unknown
        return None, None


def _answer(probe, namespace):
    scope = dict(namespace) if probe.get("fresh") else namespace
    values, shown = [], []
    try:
        for step in probe["steps"]:
            if step["run"]:
                _exec(_compile(step["run"], "<test>", "exec"), scope)
            for item in step["items"]:
                value, text = _item(item, scope, values)
                values.append(value)
                shown.append(text)
    except _BaseException as exc:  # noqa: BLE001 - a probe's SystemExit is a failed test, not the end
        return {"error": f"{_type(exc).__name__}: {_str(exc)[:500]}"}
    return {"values": shown}


def main():
    line = b""
    while not line.endswith(b"\n"):
        chunk = _read(0, 64)
        if not chunk:
            return
        line += chunk
    channel = _Channel(int(line))
    path = sys.argv[1]
    with open(path, encoding="utf-8") as f:
        code = _compile(f.read(), path, "exec")
    namespace = {"__name__": "solution", "__file__": path, "__builtins__": __builtins__}
    sys.argv = [path]
    _exec(code, namespace)
    channel.send({"loaded": True})
    while True:
        probe = channel.receive()
        if probe is None:
            return
        channel.send({"token": probe["token"], **_answer(probe, namespace)})


main()

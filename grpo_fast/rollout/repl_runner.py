"""REPL runner: one persistent Python interpreter in a sandbox, the server behind python_tool.PythonEnvironment.

Standalone (stdlib only), started by the launcher's "start" op as
`python -I -c <sandbox/runner_channel.py + this source> <max_chars>` (sandbox.runner_argv). stdin holds one line,
the number of its channel's file descriptor (a socket to the launcher), then ends. It says {"hello": true}, then
answers each request line on the channel with one line:

  {"code": text}  ->  {"output": text}, or {"output": text, "error": traceback} when the code raised

The code runs as a cell of an interactive interpreter, in the one namespace that all requests share (named
"__main__"): when its last statement is an expression, sys.displayhook prints its repr (None prints nothing).
`output`: what the code wrote to sys.stdout and sys.stderr, in order, its first `max_chars` characters and then
a note of how many were left out (writes below those objects, such as os.write or child processes, are not
captured). `error`: the last `max_chars` characters of the traceback of the exception the code raised
(SystemExit included), the runner's own frame left out and the cells' source lines shown. A request that is not
such JSON gets {"error": ...} alone. Lone surrogates are sent as backslash escapes and answers are ASCII JSON,
so an answer takes at most 12 bytes per character of `output` and `error`, plus a few dozen.
"""

# ruff: noqa: F821 - _channel_fd, _line_channel: sandbox/runner_channel.py, prepended to this source

import ast
import builtins
import io
import json
import linecache
import sys
import traceback


class _Output(io.StringIO):
    """sys.stdout and sys.stderr while a cell runs: keeps the first `limit` characters, counts the rest."""

    def __init__(self, limit):
        super().__init__()
        self.limit, self.kept, self.dropped = limit, 0, 0

    def write(self, text):
        room = max(self.limit - self.kept, 0)
        self.kept += super().write(text[:room])
        self.dropped += max(len(text) - room, 0)
        return len(text)

    def text(self):
        note = f"\n[{self.dropped} more characters of output not shown]\n" if self.dropped else ""
        return self.getvalue() + note


def _run(code, name, namespace):
    """Run `code` as the cell `name` in `namespace`: the traceback text of what it raised, or None."""
    try:
        body = ast.parse(code, name).body
        shown = body[-1:] if body and isinstance(body[-1], ast.Expr) else []
        statements = compile(ast.Module(body[: len(body) - len(shown)], []), name, "exec")
        last = compile(ast.Interactive(shown), name, "single")
    except BaseException as exc:  # noqa: BLE001 - SyntaxError, null bytes, nesting too deep: the cell's error
        return "".join(traceback.format_exception_only(type(exc), exc))
    try:
        exec(statements, namespace)
        exec(last, namespace)
    except BaseException as exc:  # noqa: BLE001 - whatever the code raises, SystemExit too, is its answer
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next))
    return None


def _cell(code, number, namespace, limit):
    """The answer to a request to run `code`, the `number`th cell."""
    name = f"<cell {number}>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    output = _Output(limit)
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = output
    try:
        error = _run(code, name, namespace)
    finally:
        sys.stdout, sys.stderr = saved
    answer = {"output": _escaped(output.text())}
    if error is not None:
        answer["error"] = _escaped(error[-limit:])
    return answer


def _escaped(text):
    """`text` with lone surrogates as backslash escapes: valid UTF-8 for the caller."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def main():
    fd = _channel_fd()
    if fd is None:
        return
    receive, send = _line_channel(fd, json.dumps)
    limit = int(sys.argv[1])
    sys.argv = [""]
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    send({"hello": True})
    number = 0
    while (line := receive()) is not None:
        try:
            code = json.loads(line)["code"]
        except (ValueError, TypeError, KeyError):
            code = None
        if not isinstance(code, str):
            send({"error": 'malformed request: expected {"code": text}'})
            continue
        number += 1
        send(_cell(code, number, namespace, limit))


main()

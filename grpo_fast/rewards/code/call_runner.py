"""Call runner: the program's side of an assert test, in the program's sandbox.

Started by the launcher as `python -I -c <wire.py + this source> solution.py`. stdin holds one line,
the number of its channel's file descriptor (a socket to the launcher), then ends. It says
{"hello": true} before it reads the program (so a start that fails is never the program's doing; it
may start before the program is written), and reads and compiles it at the first load. Then, per
request line (JSON, values in the wire form of wire.py):

  {"fresh": true, "prelude": statements, ...}   first request of a test: the program runs again, in a
                         new namespace (module `solution`, so an `if __name__ == "__main__":` block
                         does not run), the handles of the previous test are dropped, and the test's
                         prelude (seeding statements, cases.py) runs in a namespace of its own;
                         {"load_error": "..."} if the program raises. With "op": "load" that is
                         all, answered {"loaded": true}.
  {"op": "call", "target": t, "args": [v, ...], "kwargs": [[name, v], ...]}   t(*args, **kwargs)
  {"op": "getattr" | "setattr", "target": t, "name": n, "value": v}           t.n / t.n = v
  {"op": "getitem" | "setitem" | "delitem", "target": t, "key": k, "value": v}
  {"op": "apply", "fn": f, "target": t, "arg": a}   f(t) for f in len, bool, str, repr, int, float,
                         complex, index, list (iteration), next, hash; `isinstance`
                         (isinstance(a, t)) takes `arg`
  {"op": "value", "target": t}   t as plain data only (container subclasses as their container), or
                         {"opaque": true} when it has no such value

where a target is a name {"n": ...} of the program's namespace or a handle {"h": ...} to an object an
earlier request of this test returned. Answers, one line each: {"value": v, "after": [[i, v], ...]}
("after": the arguments i that are lists, dicts, sets or bytearrays, as the call left them, so that
the judge sees in-place changes), {"raised": [exception type name, message]}, {"load_error": ...}
or {"error": ...} (a malformed request, or a result that is not plain data where it must be);
"raised" also lists the names of the exception's classes, most derived first.

Batch mode (the remote backend, where a service runs this source as `python <file>` with stdin and
captures stdout): with `_BATCH = True` defined before this source, the requests are stdin's lines and
the answers are written on stdout, one line each after the request's; the program's own output on
stdout goes to /dev/null.

Nothing here is trusted: the program shares this interpreter and may rewrite any answer. What it can
never do is see more than the requests (names, argument values, its own handles) or make the judge
run its objects: answers are data, read by the judge with wire.decode (judge_runner.py).
"""

# ruff: noqa: F821 - encode, decode, dumps, loads, WireError: wire.py, and _channel_fd, _line_channel:
# sandbox/runner_channel.py, prepended to this source

import os as _os
import sys as _sys

_compile, _exec, _BaseException = compile, exec, BaseException
_APPLY = {
    "len": len,
    "bool": bool,
    "str": str,
    "repr": repr,
    "int": int,
    "float": float,
    "complex": complex,
    "index": lambda x: x.__index__(),
    "list": list,
    "next": next,
    "hash": hash,
}
_MUTABLE = (list, dict, set, bytearray)


class _Test:
    """The program's namespace and handles for one test."""

    def __init__(self, code, path, prelude):
        self.objects, self.numbers = [], {}
        self.namespace = {"__name__": "solution", "__file__": path, "__builtins__": __builtins__}
        _exec(code, self.namespace)
        if prelude:
            try:
                _exec(prelude, {"__builtins__": __builtins__})
            except _BaseException:  # noqa: BLE001 - a seed the program's environment lacks changes nothing
                pass

    def handle(self, obj):
        number = self.numbers.get(id(obj))
        if number is None or self.objects[number] is not obj:
            number = self.numbers[id(obj)] = len(self.objects)
            self.objects.append(obj)
        return {"h": number}

    def lookup(self, tag, body):
        if tag == "h":
            if not 0 <= body < len(self.objects):
                raise WireError(f"no handle {body}")
            return self.objects[body]
        if body in self.namespace:
            return self.namespace[body]
        raise NameError(f"name {body!r} is not defined")

    def value(self, data):
        return decode(data, self.lookup)

    def answer(self, request):
        op = request.get("op")
        target = self.value(request.get("target"))
        if op == "value":
            try:
                return {"value": encode(target, None, True)}
            except WireError:
                return {"opaque": True}
        if op == "call":
            args = [self.value(a) for a in request.get("args", [])]
            kwargs = {name: self.value(v) for name, v in request.get("kwargs", [])}
            result = target(*args, **kwargs)
            changed = [[i, a] for i, a in enumerate(args) if isinstance(a, _MUTABLE)]
            changed += [[name, a] for name, a in kwargs.items() if isinstance(a, _MUTABLE)]
            after = [[i, encode(a, self.handle)] for i, a in changed]
            return {"value": encode(result, self.handle), "after": after}
        if op == "getattr":
            result = getattr(target, request["name"])
        elif op == "setattr":
            result = setattr(target, request["name"], self.value(request.get("value")))
        elif op == "getitem":
            result = target[self.value(request.get("key"))]
        elif op == "setitem":
            target[self.value(request.get("key"))] = self.value(request.get("value"))
            result = None
        elif op == "delitem":
            del target[self.value(request.get("key"))]
            result = None
        elif op == "apply" and request.get("fn") == "isinstance":
            result = isinstance(self.value(request.get("arg")), target)
        elif op == "apply" and request.get("fn") in _APPLY:
            result = _APPLY[request["fn"]](target)
        else:
            return {"error": f"unknown request {op!r}"}
        return {"value": encode(result, self.handle)}


def _program(path):
    """The program's code object: `path` read and compiled when first needed (the runner may start
    before the program is written); a program that does not compile raises at every load."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    try:
        return _compile(source, path, "exec")
    except Exception as exc:  # noqa: BLE001 - SyntaxError, null bytes, nesting too deep: every test fails
        return _compile(f"raise SyntaxError({str(exc)[:300]!r})", path, "exec")


def _serve(path, receive, send):
    code = test = None
    while True:
        line = receive()
        if line is None:
            return
        try:
            request = loads(line)
            if request.get("fresh"):
                test = None
                try:
                    code = code or _program(path)
                    test = _Test(code, path, request.get("prelude"))
                except _BaseException as exc:  # noqa: BLE001 - the program's SystemExit too
                    send({"load_error": f"{type(exc).__name__}: {str(exc)[:500]}"})
                    continue
            if test is None:
                send({"load_error": "the program is not loaded"})
                continue
            if request.get("op") == "load":
                send({"loaded": True})
                continue
            try:
                reply = test.answer(request)
            except WireError as exc:
                reply = {"error": str(exc)}
            except _BaseException as exc:  # noqa: BLE001 - whatever the program raises is its answer
                names = [kind.__name__ for kind in type(exc).__mro__]
                reply = {"raised": [type(exc).__name__, str(exc)[:500], names]}
            send(reply)
        except _BaseException as exc:  # noqa: BLE001 - an answer that cannot be encoded or sent
            send({"error": f"{type(exc).__name__}: {str(exc)[:200]}"})


def _batch_channel():
    """Requests from stdin; answers on a copy of stdout, whose own fd now points at /dev/null."""
    answers = _os.dup(1)
    null = _os.open(_os.devnull, _os.O_WRONLY)
    _os.dup2(null, 1)
    receive, _ = _line_channel(0, dumps)
    _, send = _line_channel(answers, dumps)
    return receive, send


def main():
    if globals().get("_BATCH"):
        receive, send = _batch_channel()
    else:
        fd = _channel_fd()
        if fd is None:
            return
        receive, send = _line_channel(fd, dumps)
    send({"hello": True})
    path = _sys.argv[1] if len(_sys.argv) > 1 else "solution.py"
    _sys.argv = [path]
    _serve(path, receive, send)


main()

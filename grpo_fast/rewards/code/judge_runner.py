"""Judge runner: runs assert tests in a clean interpreter, asking the program's sandbox for calls only.

Started by the launcher as `python -I -c <runner_channel.py + wire.py + this source>`, in a sandbox of its
own that never runs a program. stdin holds the number of its channel's file descriptor, as for call_runner.py. It
says {"hello": true}, then serves:

  {"test": source, "program": [names], "known": {name: "module:attribute" or "module"},
   "cpu_s": seconds}
      runs the test in a fresh namespace: the real builtins, the `known` names imported for real
      (`Counter`, `np`, ...), and for each program name a `Remote` that stands for the program's
      global of that name; `import solution` / `from solution import f` give the same. Every use
      of a Remote that needs the program (a call, an attribute, an item, len/bool/str/iteration,
      ...) is one request, sent as {"call": request} (call_runner.py's requests, values in wire
      form); the answer comes back as {"reply": the program's raw answer line} or {"failed": why}
      (the program died, overran its time, or answered out of turn). Answers are decoded as data
      (wire.decode): a value that is not data comes back as a new Remote (a handle).
      When the test ends: {"done": passed, "why": "..."}.

What runs here: the test's own code, with the real builtins and modules, on plain data. What the
program is sent: names, argument values (plain data, or its own handles) and attribute names; never
a statement, the test's other values, or the test's functions. Comparisons, arithmetic and hashing
of a program's object use its value as plain data (`value` request: container subclasses as their
container); an object without one makes the test fail. So do the attributes that the builtin data
types have (`keys`, `count`, `real`, `endswith`, ...) but do not change (`append`, `pop` do): they
are taken from the object's plain value, where it has one; an object without one answers them
itself, except the predicates (`endswith`, `issubset`, `isupper`, ...), which make the test fail. Membership
(`x in obj`) is decided here too: in the object's plain value, or else in the items its iteration yields.
The test fails too, whatever it catches, when the program's sandbox fails a request, when an answer
is not valid wire data, or when the test's own CPU time passes `cpu_s` (signal-based: a test that
catches BaseException around a long computation only ends at the caller's wall-clock limit).
Exceptions the program raises are raised here as the nearest builtin exception type among `_RAISED`
(else ProgramError), never as StopIteration (which would end a loop of the test early) except from
`next()`.
"""

# ruff: noqa: F821 - encode, decode, dumps, loads, WireError: wire.py, and _channel_fd: sandbox/runner_channel.py,
# prepended to this source

import builtins as _builtins
import importlib as _importlib
import os as _os
import signal as _signal
import sys as _sys
import types as _types

_RAISED = {
    name: getattr(_builtins, name)
    for name in (
        "ArithmeticError AssertionError AttributeError BufferError EOFError FloatingPointError ImportError "
        "IndexError KeyError LookupError MemoryError ModuleNotFoundError NameError NotImplementedError OSError "
        "OverflowError RecursionError RuntimeError TypeError UnboundLocalError ValueError ZeroDivisionError "
        "FileNotFoundError PermissionError TimeoutError UnicodeError Exception"
    ).split()
}


_DATA_TYPES = (str, bytes, bytearray, list, tuple, dict, set, frozenset, int, float, complex)
_DATA_NAMES = frozenset(name for kind in _DATA_TYPES for name in dir(kind) if not name.startswith("__"))
_MUTATING = frozenset(
    "append extend insert pop remove clear sort reverse popitem update setdefault add discard "
    "difference_update intersection_update symmetric_difference_update".split()
)
_PREDICATES = frozenset(
    ["startswith", "endswith", "issubset", "issuperset", "isdisjoint"] + [n for n in dir(str) if n.startswith("is")]
)
_OPAQUE = object()  # the program's object has no value as plain data


class ProgramError(Exception):
    """An exception the program raised that is not one of the builtin types in _RAISED."""


class _Abort(BaseException):
    """The test fails whatever it does next (see module doc)."""


class _Session:
    """The channel to the caller and the state of the test being run."""

    def __init__(self, fd):
        self.fd, self.buffer, self.failure = fd, b"", None
        self.talking = self.out_of_time = False  # SIGPROF waits while a request is on its way

    def begin(self):
        self.failure, self.out_of_time = None, False

    def receive(self):
        while b"\n" not in self.buffer:
            chunk = _os.read(self.fd, 1 << 16)
            if not chunk:
                _os._exit(0)
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return loads(line)

    def send(self, message):
        data = (dumps(message) + "\n").encode()
        while data:
            data = data[_os.write(self.fd, data) :]

    def abort(self, why):
        if self.failure is None:
            self.failure = why
        raise _Abort(why)

    def ask(self, request):
        """The program's decoded answer to `request` (values already in wire form)."""
        if self.failure is not None:
            raise _Abort(self.failure)
        self.talking = True
        try:
            self.send({"call": request})
            message = self.receive()
        finally:
            self.talking = False
        if self.out_of_time:
            self.abort("the test used more than its CPU time")
        if not isinstance(message, dict) or "reply" not in message:
            self.abort(f"the program failed: {str(message.get('failed'))[:300]}")
        try:
            reply = loads(message["reply"])
            if not isinstance(reply, dict):
                raise WireError("not an answer")
            if "value" in reply:
                value = decode(reply["value"], _remote)
                after = reply.get("after") or []
                return value, [(key, decode(v, _remote)) for key, v in after]
        except WireError as exc:
            self.abort(f"the program's answer is not plain data: {exc}")
        if request.get("op") == "value" and reply.get("opaque") is True:
            return _OPAQUE, []
        if "raised" in reply:
            raise _program_exception(reply["raised"], request)
        self.abort(f"the program did not answer: {str(reply)[:300]}")


_session = None


def _program_exception(raised, request):
    names = raised[2] if isinstance(raised, list) and len(raised) == 3 and isinstance(raised[2], list) else []
    message = str(raised[1])[:500] if isinstance(raised, list) and len(raised) > 1 else ""
    if request.get("fn") == "next" and "StopIteration" in names:
        return StopIteration()
    for name in names:
        if isinstance(name, str) and name in _RAISED:
            try:
                return _RAISED[name](message)
            except Exception:  # noqa: BLE001 - a constructor that wants other arguments
                break
    return ProgramError(f"{names[0] if names else 'an exception'}: {message}")


def _wire_of(value):
    if type(value) is Remote:
        return object.__getattribute__(value, "_w")
    raise WireError(f"a {type(value).__name__} is not plain data: it cannot be passed to the program")


def _arg(value):
    try:
        return encode(value, _wire_of, True)
    except WireError as exc:
        _session.abort(f"unjudgeable: {exc}")


def _request(op, target, **fields):
    value, after = _session.ask({"op": op, "target": object.__getattribute__(target, "_w"), **fields})
    return value, after


def _apply(target, fn, kind=None, **fields):
    value = _request("apply", target, fn=fn, **fields)[0]
    if kind is not None and type(value) is not kind:
        _session.abort(f"the program's {fn}() is a {type(value).__name__}, not a {kind.__name__}")
    return value


def _value(operand, required=True):
    """A Remote's value as plain data (the `value` request); anything else as it is. Without a plain
    value: the test fails (`required`), else _OPAQUE."""
    if type(operand) is not Remote:
        return operand
    value = _request("value", operand)[0]
    if value is _OPAQUE or type(value) is Remote:
        if required:
            _session.abort("the program's object has no value as plain data")
        return _OPAQUE
    return value


def _update(original, new):
    """Carry an argument's in-place change back to the test's own object."""
    if type(original) is list and type(new) is list or type(original) is bytearray and type(new) is bytearray:
        original[:] = new
    elif type(original) is dict and type(new) is dict or type(original) is set and type(new) is set:
        original.clear()
        original.update(new)


class Remote:
    """A program's global (by name) or object (by handle) as the test sees it (see module doc)."""

    __slots__ = ("_w",)

    def __init__(self, wire):
        object.__setattr__(self, "_w", wire)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name in _DATA_NAMES and name not in _MUTATING:
            value = _value(self, required=name in _PREDICATES)
            if value is not _OPAQUE:
                return getattr(value, name)
        return _request("getattr", self, name=name)[0]

    def __setattr__(self, name, value):
        _request("setattr", self, name=name, value=_arg(value))

    def __call__(self, *args, **kwargs):
        request = {"args": [_arg(a) for a in args], "kwargs": [[k, _arg(v)] for k, v in kwargs.items()]}
        value, after = _request("call", self, **request)
        for key, new in after:
            original = args[key] if type(key) is int and 0 <= key < len(args) else kwargs.get(key)
            _update(original, new)
        return value

    def __getitem__(self, key):
        return _request("getitem", self, key=_arg(key))[0]

    def __setitem__(self, key, value):
        _request("setitem", self, key=_arg(key), value=_arg(value))

    def __delitem__(self, key):
        _request("delitem", self, key=_arg(key))

    def __len__(self):
        return _apply(self, "len", int)

    def __bool__(self):
        return _apply(self, "bool", bool)

    def __iter__(self):
        return iter(_apply(self, "list", list))

    def __next__(self):
        return _apply(self, "next")

    def __contains__(self, item):
        value = _value(self, required=False)
        return item in (_apply(self, "list", list) if value is _OPAQUE else value)

    def __str__(self):
        return _apply(self, "str", str)

    def __repr__(self):
        return _apply(self, "repr", str)

    def __int__(self):
        return _apply(self, "int", int)

    def __index__(self):
        return _apply(self, "index", int)

    def __float__(self):
        return _apply(self, "float", float)

    def __complex__(self):
        return _apply(self, "complex", complex)

    def __instancecheck__(self, instance):
        return _apply(self, "isinstance", bool, arg=_arg(instance))

    def __hash__(self):
        return hash(_value(self))


def _operator(name):
    import operator

    function = getattr(operator, name)

    def method(self, *others):
        return function(_value(self), *(_value(other) for other in others))

    def reflected(self, other):
        return function(_value(other), _value(self))

    return method, reflected


for _name in "eq ne lt le gt ge".split():
    setattr(Remote, f"__{_name}__", _operator(_name)[0])
for _name in "add sub mul truediv floordiv mod pow lshift rshift and or xor matmul".split():
    _method, _reflected = _operator(_name if _name not in ("and", "or") else _name + "_")
    setattr(Remote, f"__{_name}__", _method)
    setattr(Remote, f"__r{_name}__", _reflected)
for _name in "neg pos abs invert".split():
    setattr(Remote, f"__{_name}__", _operator(_name)[0])
Remote.__round__ = lambda self, *ndigits: round(_value(self), *ndigits)
Remote.__divmod__ = lambda self, other: divmod(_value(self), _value(other))
Remote.__rdivmod__ = lambda self, other: divmod(_value(other), _value(self))


def _remote(tag, body):
    return Remote({tag: body})


def _solution_module():
    module = _types.ModuleType("solution")
    module.__getattr__ = lambda name: Remote({"n": name})
    return module


def _known(spec):
    module, _, attribute = spec.partition(":")
    value = _importlib.import_module(module)
    return getattr(value, attribute) if attribute else value


def _cpu_limit(signum, frame):
    if _session.talking:
        _session.out_of_time = True  # raised once the answer is read, so that no answer is left behind
    else:
        _session.abort("the test used more than its CPU time")


def _run(message):
    namespace = {"__name__": "__test__", "__builtins__": _builtins}
    for name, spec in (message.get("known") or {}).items():
        try:
            namespace[name] = _known(spec)
        except Exception:  # noqa: BLE001 - a module this interpreter lacks: the name stays undefined
            pass
    for name in message.get("program") or ():
        namespace[name] = Remote({"n": name})
    _sys.modules["solution"] = _solution_module()
    _session.begin()
    _signal.setitimer(_signal.ITIMER_PROF, float(message.get("cpu_s") or 10.0))
    passed, why = True, ""
    try:
        exec(compile(message["test"], "<test>", "exec"), namespace)
    except _Abort:
        passed = False
    except BaseException as exc:  # noqa: BLE001 - a failed assert, or anything else the test raises
        passed, why = False, f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        _signal.setitimer(_signal.ITIMER_PROF, 0)
    if _session.failure is not None:
        passed, why = False, _session.failure
    return {"done": passed, "why": why}


def main():
    global _session
    fd = _channel_fd()
    if fd is None:
        return
    _session = _Session(fd)
    _signal.signal(_signal.SIGPROF, _cpu_limit)
    _session.send({"hello": True})
    while True:
        message = _session.receive()
        try:
            reply = _run(message)
        except BaseException as exc:  # noqa: BLE001 - the judge answers every test, whatever happened
            reply = {"done": False, "why": f"judge: {type(exc).__name__}: {str(exc)[:300]}"}
        _session.send(reply)


main()

"""Plain data across the sandbox boundary: how values travel between the program and the judge.

Standalone (stdlib only): its source is prepended to call_runner.py and judge_runner.py, which run in
sandboxes where grpo_fast is not importable.

A value on the wire is JSON: null, booleans, integers, floats (NaN and Infinity included), strings
and arrays (lists) as themselves; every other value is an object with one key, its tag:
  {"t": [...]} tuple, {"s": [...]} set, {"fs": [...]} frozenset, {"d": [[key, value], ...]} dict,
  {"C": pairs} Counter, {"O": pairs} OrderedDict, {"dd": pairs} defaultdict (read back as a dict),
  {"q": [...]} deque, {"b": hex} bytes, {"ba": hex} bytearray, {"c": [real, imag]} complex,
  {"r": [start, stop, step]} range, {"F": [numerator, denominator]} Fraction, {"M": text} Decimal,
  {"nd": [dtype, nested list]} a numpy array of numbers (a list where numpy is missing),
  {"h": n} the program's object number n (a handle: the object stays in the program's process),
  {"n": name} the program's global `name` (sent by the judge only).

`encode` turns a value into that form: exact builtin types (and the stdlib types above) as data,
subclasses of int/float/complex/str/bytes and numpy scalars as their plain value, numpy number arrays
as "nd", with `convert` subclasses of list/tuple/dict/set/frozenset as their plain container, and
anything else as what `handle(value)` returns (a handle's or a name's wire form); with `handle=None`
anything that is not data raises WireError. `decode` reads it back within `MAX_DEPTH` levels and `MAX_NODES` values
(integers are bounded by JSON reading: 4300 digits); anything else raises WireError. Neither side
ever runs code of the other: a handle is a number, a name is a string.
"""

import json as _wire_json

MAX_DEPTH = 100
MAX_NODES = 1_000_000
_PAIRS = {"d": dict, "C": None, "O": None, "dd": dict}
_NUMPY_KINDS = "biufc"  # bool, int, unsigned, float, complex


class WireError(ValueError):
    """A value that cannot cross: not plain data, too deep, too many parts, or malformed."""


def _stdlib(name):
    """collections / fractions / decimal types, imported when first met (they cost import time)."""
    if name in ("Counter", "OrderedDict", "defaultdict", "deque"):
        import collections

        return getattr(collections, name)
    if name == "Fraction":
        import fractions

        return fractions.Fraction
    import decimal

    return decimal.Decimal


_BY_NAME = {
    ("collections", "Counter"): "C",
    ("collections", "OrderedDict"): "O",
    ("collections", "defaultdict"): "dd",
    ("collections", "deque"): "q",
    ("fractions", "Fraction"): "F",
    ("decimal", "Decimal"): "M",
}


class _Budget:
    """What one encode or decode may still use, and how it treats container subclasses."""

    def __init__(self, convert=False):
        self.nodes, self.convert = MAX_NODES, convert

    def spend(self, depth):
        self.nodes -= 1
        if self.nodes < 0:
            raise WireError(f"more than {MAX_NODES} values")
        if depth > MAX_DEPTH:
            raise WireError(f"nested deeper than {MAX_DEPTH} levels (or cyclic)")


def encode(value, handle=None, convert=False):
    """The wire form of `value` (see module doc); `handle(obj)` gives the wire form of objects that are
    not data; `convert`: subclasses of the builtin containers travel as those containers."""
    return _encode(value, handle, _Budget(convert), 0)


def _encode(value, handle, budget, depth):
    budget.spend(depth)
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is float or kind is str:
        return value
    if kind is list:
        return [_encode(v, handle, budget, depth + 1) for v in value]
    if kind is tuple:
        return {"t": [_encode(v, handle, budget, depth + 1) for v in value]}
    if kind is set or kind is frozenset:
        return {"s" if kind is set else "fs": [_encode(v, handle, budget, depth + 1) for v in value]}
    if kind is dict:
        return {"d": _encode_pairs(value, handle, budget, depth)}
    if kind is bytes or kind is bytearray:
        return {"b" if kind is bytes else "ba": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    if kind is range:
        return {"r": [value.start, value.stop, value.step]}
    tag = _BY_NAME.get((getattr(kind, "__module__", None), getattr(kind, "__qualname__", None)))
    if tag is not None and kind is _stdlib(kind.__qualname__):
        if tag in _PAIRS:
            return {tag: _encode_pairs(value, handle, budget, depth)}
        if tag == "q":
            return {"q": [_encode(v, handle, budget, depth + 1) for v in value]}
        if tag == "F":
            return {"F": [int(value.numerator), int(value.denominator)]}
        return {"M": str(value)}
    plain = _plain_scalar(value)
    if plain is not None:
        return _encode(plain, handle, budget, depth)
    array = _numpy_array(value)
    if array is not None:
        return {"nd": [array[0], _encode(array[1], handle, budget, depth + 1)]}
    if budget.convert:
        for base in (list, tuple, dict, set, frozenset):
            if isinstance(value, base):
                return _encode(base(value), handle, budget, depth)
    if handle is None:
        raise WireError(f"a {kind.__name__} is not plain data")
    return handle(value)


def _encode_pairs(mapping, handle, budget, depth):
    return [[_encode(k, handle, budget, depth + 1), _encode(v, handle, budget, depth + 1)] for k, v in mapping.items()]


def _plain_scalar(value):
    """The builtin value of a subclass of int/float/complex/str/bytes, or of a numpy scalar; else None."""
    for base in (int, float, complex, str, bytes):
        if isinstance(value, base):
            return base(value)
    module = getattr(type(value), "__module__", "") or ""
    if module.split(".")[0] == "numpy" and hasattr(value, "item") and getattr(value, "shape", None) == ():
        item = value.item()
        return item if type(item) in (bool, int, float, complex, str, bytes) else None
    return None


def _numpy_array(value):
    """(dtype string, nested list) of a numpy array of numbers or booleans; else None."""
    module = getattr(type(value), "__module__", "") or ""
    if module.split(".")[0] != "numpy" or type(value).__name__ != "ndarray":
        return None
    if value.dtype.kind not in _NUMPY_KINDS:
        return None
    return value.dtype.str, value.tolist()


def decode(data, handle=None):
    """The value that wire form `data` denotes; `handle(tag, body)` gives what a handle ("h", n) or a name
    ("n", name) stands for (without `handle` they raise WireError)."""
    return _decode(data, handle, _Budget(), 0)


def _decode(data, handle, budget, depth):
    budget.spend(depth)
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is float or kind is str:
        return data
    if kind is list:
        return [_decode(v, handle, budget, depth + 1) for v in data]
    if kind is not dict or len(data) != 1:
        raise WireError("malformed value")
    ((tag, body),) = data.items()
    try:
        return _decode_tagged(tag, body, handle, budget, depth)
    except WireError:
        raise
    except (TypeError, ValueError, ArithmeticError) as exc:  # unhashable set items, bad hex, zero denominator
        raise WireError(f"malformed {tag!r} value: {exc}") from None


def _items(body, handle, budget, depth):
    if type(body) is not list:
        raise WireError("malformed value")
    return [_decode(v, handle, budget, depth + 1) for v in body]


def _decode_tagged(tag, body, handle, budget, depth):
    if tag == "t":
        return tuple(_items(body, handle, budget, depth))
    if tag == "s":
        return set(_items(body, handle, budget, depth))
    if tag == "fs":
        return frozenset(_items(body, handle, budget, depth))
    if tag in _PAIRS:
        pairs = _items(body, handle, budget, depth)
        if not all(type(p) is list and len(p) == 2 for p in pairs):
            raise WireError("malformed pairs")
        kind = _PAIRS[tag] or _stdlib("Counter" if tag == "C" else "OrderedDict")
        return kind((k, v) for k, v in pairs)
    if tag == "q":
        return _stdlib("deque")(_items(body, handle, budget, depth))
    if tag in ("b", "ba") and type(body) is str:
        return (bytes if tag == "b" else bytearray).fromhex(body)
    if tag == "c" and _numbers(body, 2, (int, float)):
        return complex(*body)
    if tag == "r" and _numbers(body, 3, (int,)):
        return range(*body)
    if tag == "F" and _numbers(body, 2, (int,)):
        return _stdlib("Fraction")(*body)
    if tag == "M" and type(body) is str and len(body) < 5000:
        return _stdlib("Decimal")(body)
    if tag == "nd" and type(body) is list and len(body) == 2 and type(body[0]) is str:
        return _array(body[0], _decode(body[1], None, budget, depth + 1))
    if tag in ("h", "n") and handle is not None and type(body) is (int if tag == "h" else str):
        return handle(tag, body)
    raise WireError(f"malformed or unexpected {tag!r} value")


def _numbers(body, count, kinds):
    return type(body) is list and len(body) == count and all(type(v) in kinds for v in body)


def _array(dtype, values):
    try:
        import numpy
    except ImportError:
        return values
    if numpy.dtype(dtype).kind not in _NUMPY_KINDS:
        raise WireError("malformed array")
    return numpy.array(values, dtype=dtype)


def dumps(data):
    """One line of JSON (no newline inside) for a wire message."""
    return _wire_json.dumps(data, separators=(",", ":"))


def loads(line):
    """A wire message from one line; WireError for anything but JSON within the nesting limit."""
    try:
        return _wire_json.loads(line)
    except (ValueError, RecursionError, MemoryError) as exc:
        raise WireError(f"malformed message: {type(exc).__name__}") from None

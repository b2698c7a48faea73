"""The judge: computes an assert test's verdict in this process, from literal values only.

`plan.py` rewrites each assert condition so that what needs the candidate's program is a `Probe`
leaf (the literal the candidate answered), what needs the test's own setup is a `Resolved` leaf (the
literal a clean interpreter answered), and everything else is evaluated here by a small interpreter
that knows only: constants; tuple/list/set/dict displays; boolean, unary and binary operators;
comparisons; conditional expressions; subscripts and slices; comprehensions and lambdas over those;
calls of the pure builtins and math functions in `TRUSTED_NAMES`; calls of the pure methods of
builtin values in `_METHODS`.

Why running it in-process is safe:
- Nothing of the candidate runs here: its answers arrive as text and are read by `read_value`, a
  literal reader (the `ast.literal_eval` grammar plus inf, nan, set(), frozenset(), Counter(),
  OrderedDict(), deque() of literals). No object of the candidate, hence no special method it wrote
  (`__eq__`, `__bool__`, `__repr__`), ever reaches the judge.
- Nothing of the dataset runs here either, beyond this grammar: names resolve to the tables below or
  to comprehension/lambda variables, attributes to math functions or `_METHODS`; every value is built
  from literals by builtin code. Anything else was sent to a clean sandbox by `plan.py`.
- Work is bounded: every node evaluated, and the size of every value it touches, is paid from a fuel
  budget; operations whose result can dwarf their operands (`*`, `**`, `<<`, pow, range, bytes,
  round, str.join, sum with a non-number start) are checked before they run; integers are capped
  at `MAX_INT_BITS`, sequences built by repetition at `MAX_SIZE`. A verdict that runs out of fuel,
  or hits a cap, fails.
"""

from __future__ import annotations

import ast
import builtins
import math
import operator
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

MAX_INT_BITS = 1 << 16
MAX_SIZE = 1 << 22
FUEL = 10_000_000
_NODE_COST = 16

TRUSTED_BUILTINS = (
    "abs all any bin bool bytes chr complex dict divmod enumerate filter float frozenset hex int isinstance len list "
    "map max min oct ord pow range repr reversed round set sorted str sum tuple type zip"
).split()
TRUSTED_MATH = (
    "acos asin atan atan2 ceil copysign cos cosh degrees dist e exp expm1 fabs floor fmod frexp fsum gcd hypot inf "
    "isclose isfinite isinf isnan isqrt ldexp log log10 log1p log2 modf nan pi pow radians remainder sin sinh sqrt "
    "tan tanh tau trunc"
).split()
HIGHER_ORDER = {"map": 0, "filter": 0, "sorted": "key", "min": "key", "max": "key"}
"""Trusted builtins that call a function they are given: position or keyword of that function."""

_READ_ONLY_SEQUENCE = {"count", "index"}
_STR_METHODS = set(
    (
        "capitalize casefold count endswith find index isalnum isalpha isdecimal isdigit islower isnumeric isspace "
        "istitle isupper join lower lstrip partition rfind rindex rpartition rsplit rstrip split splitlines startswith "
        "strip swapcase title upper"
    ).split()
)
_DICT_METHODS = {"get", "items", "keys", "values"}
_SET_METHODS = {"difference", "intersection", "isdisjoint", "issubset", "issuperset", "symmetric_difference", "union"}
_METHODS: dict[type, set[str]] = {
    str: _STR_METHODS,
    bytes: _STR_METHODS - {"casefold", "isdecimal", "isnumeric"},
    list: _READ_ONLY_SEQUENCE,
    tuple: _READ_ONLY_SEQUENCE,
    deque: _READ_ONLY_SEQUENCE,
    dict: _DICT_METHODS,
    OrderedDict: _DICT_METHODS,
    Counter: _DICT_METHODS | {"most_common", "total"},
    set: _SET_METHODS,
    frozenset: _SET_METHODS,
}
"""Methods of builtin values the judge calls: none mutates its receiver or amplifies its size
(str.join is size-checked)."""
METHOD_NAMES = frozenset().union(*_METHODS.values())

_SEQUENCES = (str, bytes, list, tuple, deque)
_READABLE = {
    "set": set,
    "frozenset": frozenset,
    "Counter": Counter,
    "OrderedDict": OrderedDict,
    "deque": deque,
}


class Unjudgeable(Exception):
    """The verdict cannot be computed from literals within budget: the test fails."""


class _Module:
    """A trusted module as the judge sees it: only whitelisted attributes."""

    def __init__(self, attributes: dict[str, Any]) -> None:
        self.attributes = attributes


MATH = _Module({name: getattr(math, name) for name in TRUSTED_MATH})
TRUSTED_NAMES: dict[str, Any] = {**{name: getattr(builtins, name) for name in TRUSTED_BUILTINS}, "math": MATH}
"""What a name means in a verdict when the test's setup does not rebind it (the candidate's own
definitions of these names are never consulted)."""


class Probe(ast.expr):
    """A sub-expression the candidate evaluated: item `index` of its answer."""

    _fields = ("index",)


class Resolved(ast.expr):
    """A sub-expression a clean interpreter evaluated: item `index` of its answer."""

    _fields = ("index",)


class Fallback(ast.expr):
    """`call` (a trusted builtin applied to Probe leaves only); when a probed value is not a literal,
    the candidate's own answer for the call (item `index`) stands in, as Python would have run the
    value's special method (`__len__`, `__bool__`, `__iter__`) there anyway."""

    _fields = ("call", "index")


OPAQUE = object()
"""An answer that is not a literal (or is missing)."""


def read_value(text: Any) -> Any:
    """The literal `text` denotes, or OPAQUE (see module doc for the grammar)."""
    if not isinstance(text, str):
        return OPAQUE
    try:
        return _literal(ast.parse(text.strip(), mode="eval").body)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return OPAQUE


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, complex, str, bytes, type(None))):
        if isinstance(node.value, int) and node.value.bit_length() > MAX_INT_BITS:
            raise ValueError("integer too large")
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.Name) and node.id in ("inf", "nan"):
        return float(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, (int, float, complex)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        left, right = _literal(node.left), _literal(node.right)
        if type(left) in (int, float) and type(right) is complex:
            return left + right if isinstance(node.op, ast.Add) else left - right
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _READABLE
        and not node.keywords
        and len(node.args) <= 1
    ):
        return _READABLE[node.func.id](*(_literal(a) for a in node.args))
    raise ValueError("not a literal")


def verdict(condition: ast.expr, probes: Sequence[Any], resolved: Sequence[Any]) -> bool:
    """Whether `condition` (a rewritten assert condition) holds; False when it raises or is unjudgeable."""
    try:
        return bool(_Judge(probes, resolved).eval(condition, {}))
    except Exception:  # noqa: BLE001 - an assert whose expression raises fails, as in Python
        return False


def comprehension_bindings(generators: list[ast.comprehension], limit: int) -> list[dict[str, Any]]:
    """The variables of each iteration of a comprehension over literals only, in order (at most `limit`)."""
    bindings = []
    for binding in _Judge((), ())._bindings(generators, {}):
        bindings.append(binding)
        if len(bindings) > limit:
            raise Unjudgeable(f"a comprehension over more than {limit} items")
    return bindings


def _size(value: Any) -> int:
    """Cost units of touching `value`: its length, or its size in 64-bit words for integers."""
    if isinstance(value, int):
        return value.bit_length() >> 6
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset, deque, range)):
        return len(value)
    return 0


class _Judge:
    """Evaluator of one verdict (see module doc); `_<NodeType>` methods are the grammar."""

    def __init__(self, probes: Sequence[Any], resolved: Sequence[Any]) -> None:
        self.probes, self.resolved, self.fuel = probes, resolved, FUEL

    def spend(self, units: int) -> None:
        self.fuel -= units
        if self.fuel < 0:
            raise Unjudgeable("the verdict needs too much work")

    def eval(self, node: ast.AST, scope: dict[str, Any]) -> Any:
        self.spend(_NODE_COST)
        handler = getattr(self, f"_{type(node).__name__}", None)
        if handler is None:
            raise Unjudgeable(f"{type(node).__name__} is not evaluated by the judge")
        value = handler(node, scope)
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise Unjudgeable("integer too large")
        self.spend(_size(value))
        return value

    # leaves

    def _Constant(self, node: ast.Constant, scope: dict[str, Any]) -> Any:
        return node.value

    def _Name(self, node: ast.Name, scope: dict[str, Any]) -> Any:
        if node.id in scope:
            return scope[node.id]
        if node.id in TRUSTED_NAMES:
            return TRUSTED_NAMES[node.id]
        raise Unjudgeable(f"name {node.id!r} is not known to the judge")

    def _Probe(self, node: Probe, scope: dict[str, Any]) -> Any:
        return _known(self.probes[node.index])

    def _Resolved(self, node: Resolved, scope: dict[str, Any]) -> Any:
        return _known(self.resolved[node.index])

    def _Fallback(self, node: Fallback, scope: dict[str, Any]) -> Any:
        if any(self.probes[arg.index] is OPAQUE for arg in node.call.args):
            return _known(self.probes[node.index])
        return self.eval(node.call, scope)

    def _Attribute(self, node: ast.Attribute, scope: dict[str, Any]) -> Any:
        module = self.eval(node.value, scope)
        if isinstance(module, _Module) and node.attr in module.attributes:
            return module.attributes[node.attr]
        raise Unjudgeable(f"attribute {node.attr!r} is not known to the judge")

    # displays

    def _items(self, nodes: list[ast.expr], scope: dict[str, Any]) -> list[Any]:
        items: list[Any] = []
        for node in nodes:
            if isinstance(node, ast.Starred):
                items.extend(self.eval(node.value, scope))
            else:
                items.append(self.eval(node, scope))
        return items

    def _Tuple(self, node: ast.Tuple, scope: dict[str, Any]) -> tuple:
        return tuple(self._items(node.elts, scope))

    def _List(self, node: ast.List, scope: dict[str, Any]) -> list:
        return self._items(node.elts, scope)

    def _Set(self, node: ast.Set, scope: dict[str, Any]) -> set:
        return set(self._items(node.elts, scope))

    def _Dict(self, node: ast.Dict, scope: dict[str, Any]) -> dict:
        result: dict[Any, Any] = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:
                result.update(_exact(self.eval(value, scope), dict))
            else:
                result[self.eval(key, scope)] = self.eval(value, scope)
        return result

    # operators

    def _BoolOp(self, node: ast.BoolOp, scope: dict[str, Any]) -> Any:
        value = None
        for operand in node.values:
            value = self.eval(operand, scope)
            if bool(value) == isinstance(node.op, ast.Or):
                break
        return value

    def _UnaryOp(self, node: ast.UnaryOp, scope: dict[str, Any]) -> Any:
        return _UNARY[type(node.op)](self.eval(node.operand, scope))

    def _BinOp(self, node: ast.BinOp, scope: dict[str, Any]) -> Any:
        left, right = self.eval(node.left, scope), self.eval(node.right, scope)
        op = type(node.op)
        _check_binop(op, left, right)
        self.spend(_size(left) + _size(right))
        return _BINARY[op](left, right)

    def _Compare(self, node: ast.Compare, scope: dict[str, Any]) -> bool:
        left = self.eval(node.left, scope)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = self.eval(comparator, scope)
            self.spend(_size(left) + _size(right))
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _IfExp(self, node: ast.IfExp, scope: dict[str, Any]) -> Any:
        return self.eval(node.body if self.eval(node.test, scope) else node.orelse, scope)

    def _Subscript(self, node: ast.Subscript, scope: dict[str, Any]) -> Any:
        value, index = self.eval(node.value, scope), self.eval(node.slice, scope)
        self.spend(_size(value))
        return value[index]

    def _Slice(self, node: ast.Slice, scope: dict[str, Any]) -> slice:
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if part is None else self.eval(part, scope) for part in parts))

    # calls

    def _Call(self, node: ast.Call, scope: dict[str, Any]) -> Any:
        function = self._callee(node.func, scope)
        args = self._items(node.args, scope)
        kwargs: dict[str, Any] = {}
        for keyword in node.keywords:
            value = self.eval(keyword.value, scope)
            kwargs.update(_exact(value, dict) if keyword.arg is None else {keyword.arg: value})
        self.spend(sum(map(_size, args)) + sum(map(_size, kwargs.values())))
        guard = _GUARDS.get(id(function))
        if guard is not None:
            guard(*args, **kwargs)
        return function(*args, **kwargs)

    def _callee(self, node: ast.expr, scope: dict[str, Any]) -> Callable[..., Any]:
        if isinstance(node, ast.Attribute) and not _is_module_attribute(node, scope):
            receiver = self.eval(node.value, scope)
            if node.attr not in _METHODS.get(type(receiver), ()):
                raise Unjudgeable(f"method {node.attr!r} is not called by the judge")
            if node.attr == "join":
                return _checked_join(receiver)
            return getattr(receiver, node.attr)
        local = isinstance(node, ast.Name) and node.id in scope
        if local or not isinstance(node, (ast.Name, ast.Attribute, ast.Lambda)):
            raise Unjudgeable("only trusted functions and lambdas are called by the judge")
        function = self.eval(node, scope)
        if not callable(function) or isinstance(function, _Module):
            raise Unjudgeable("only trusted functions and lambdas are called by the judge")
        return function

    # comprehensions and lambdas

    def _bindings(self, generators: list[ast.comprehension], scope: dict[str, Any]) -> Iterator[dict[str, Any]]:
        first, rest = generators[0], generators[1:]
        if first.is_async:
            raise Unjudgeable("async comprehension")
        for value in self.eval(first.iter, scope):
            self.spend(_NODE_COST)
            inner = {**scope}
            _bind(first.target, value, inner)
            if all(self.eval(condition, inner) for condition in first.ifs):
                yield from self._bindings(rest, inner) if rest else (inner,)

    def _ListComp(self, node: ast.ListComp, scope: dict[str, Any]) -> list:
        return [self.eval(node.elt, inner) for inner in self._bindings(node.generators, scope)]

    def _SetComp(self, node: ast.SetComp, scope: dict[str, Any]) -> set:
        return {self.eval(node.elt, inner) for inner in self._bindings(node.generators, scope)}

    def _DictComp(self, node: ast.DictComp, scope: dict[str, Any]) -> dict:
        bindings = self._bindings(node.generators, scope)
        return {self.eval(node.key, inner): self.eval(node.value, inner) for inner in bindings}

    def _GeneratorExp(self, node: ast.GeneratorExp, scope: dict[str, Any]) -> Iterator[Any]:
        return (self.eval(node.elt, inner) for inner in self._bindings(node.generators, scope))

    def _Lambda(self, node: ast.Lambda, scope: dict[str, Any]) -> Callable[..., Any]:
        params = node.args
        if params.posonlyargs or params.vararg or params.kwonlyargs or params.kwarg or params.defaults:
            raise Unjudgeable("lambda with other than plain positional parameters")
        names = [param.arg for param in params.args]

        def call(*values: Any) -> Any:
            if len(values) != len(names):
                raise TypeError("wrong number of arguments")
            return self.eval(node.body, {**scope, **dict(zip(names, values, strict=True))})

        return call


def _known(value: Any) -> Any:
    if value is OPAQUE:
        raise Unjudgeable("a value is not a literal")
    return value


def _exact(value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"expected {kind.__name__}")
    return value


def _bind(target: ast.expr, value: Any, scope: dict[str, Any]) -> None:
    if isinstance(target, ast.Name):
        scope[target.id] = value
    elif isinstance(target, (ast.Tuple, ast.List)) and not any(isinstance(t, ast.Starred) for t in target.elts):
        values = list(value)
        if len(values) != len(target.elts):
            raise ValueError("cannot unpack")
        for sub, item in zip(target.elts, values, strict=True):
            _bind(sub, item, scope)
    else:
        raise Unjudgeable("comprehension target")


def _is_module_attribute(node: ast.Attribute, scope: dict[str, Any]) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id not in scope and node.value.id in TRUSTED_NAMES


# ---- size checks of the operations that can amplify ----


def _too_big(condition: bool) -> None:
    if condition:
        raise Unjudgeable("the result would be too large")


def _int(value: Any) -> bool:
    return isinstance(value, int)


def _check_power(base: Any, exponent: Any, modulus: Any = None) -> None:
    if modulus is not None:
        _too_big(_int(exponent) and exponent.bit_length() > 4096 or _int(modulus) and modulus.bit_length() > 4096)
    elif _int(base) and _int(exponent) and exponent > 0 and abs(base) > 1:
        _too_big(base.bit_length() * exponent > MAX_INT_BITS)


def _check_binop(op: type, left: Any, right: Any) -> None:
    if op is ast.Pow:
        _check_power(left, right)
    elif op is ast.LShift and _int(left) and _int(right):
        _too_big(left.bit_length() + right > MAX_INT_BITS)
    elif op is ast.Mult:
        for sequence, count in ((left, right), (right, left)):
            if isinstance(sequence, _SEQUENCES) and _int(count):
                _too_big(len(sequence) * count > MAX_SIZE)
        if _int(left) and _int(right):
            _too_big(left.bit_length() + right.bit_length() > MAX_INT_BITS)
    elif op is ast.Mod and isinstance(left, (str, bytes)):
        raise Unjudgeable("%-formatting is not evaluated by the judge")


def _check_range(*args: Any) -> None:
    try:
        _too_big(len(range(*args)) > MAX_SIZE)
    except OverflowError:
        _too_big(True)


def _check_round(number: Any, ndigits: Any = None) -> None:
    _too_big(_int(ndigits) and abs(ndigits) > 4300)


def _check_sum(iterable: Any, start: Any = 0) -> None:
    if not isinstance(start, (int, float, complex)):
        raise Unjudgeable("sum() with a non-number start is not evaluated by the judge")


def _check_bytes(source: Any = b"", *args: Any) -> None:
    _too_big(_int(source) and source > MAX_SIZE)


def _check_type(*args: Any) -> None:
    if len(args) != 1:
        raise Unjudgeable("type() with other than one argument")


def _checked_join(separator: str | bytes) -> Callable[[Any], Any]:
    def join(iterable: Any) -> Any:
        parts = list(iterable)
        _too_big(len(separator) * len(parts) + sum(len(p) for p in parts if isinstance(p, (str, bytes))) > MAX_SIZE)
        return separator.join(parts)

    return join


_GUARDS: dict[int, Callable[..., None]] = {
    id(builtins.pow): _check_power,
    id(range): _check_range,
    id(round): _check_round,
    id(sum): _check_sum,
    id(bytes): _check_bytes,
    id(type): _check_type,
}
"""Checks run before a trusted builtin, by identity (bound methods of unhashable values cannot be keys)."""
_UNARY = {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.BitAnd: operator.and_,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: operator.contains(b, a),
    ast.NotIn: lambda a, b: not operator.contains(b, a),
}

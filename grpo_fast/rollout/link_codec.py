"""What crosses the engine link, as bytes and back, without pickle.

Two layers:

- `encode` / `decode`: plain data (dicts with string keys, lists, strings, numbers, booleans, None, bytes) <->
  bytes. The layout is [u32 n][n bytes of JSON: [tree, [buffer lengths]]][the buffers, back to back]. Bytes, and
  lists of at least `MIN_BUFFER` items of one numeric type (token ids, logprobs, masks), travel as raw buffers,
  which JSON would otherwise spell out digit by digit; in the tree such a value stands as
  {"__buffer__": [index, typecode]} ("q" int64, "d" float64, "b" bool, one byte each, "B" bytes), a key no data
  may use. `decode` checks every length and reference and builds nothing but those plain types: a message that is
  not one is a LinkProtocolError, whatever its bytes.
- `to_plain` / `from_plain`: typed values (dataclasses, tuples, torch dtypes) <-> plain data; `from_plain` checks
  every field against its type hint (grpo_fast.config_fields.coerce for the scalars) and names the first that
  does not match.
"""

from __future__ import annotations

import array
import dataclasses
import json
import struct
import typing
from typing import Any

import torch

from grpo_fast.config_fields import coerce

MARK = "__buffer__"
MIN_BUFFER = 16
BUFFER_TYPES = {int: "q", float: "d", bool: "b"}
SCALARS = (str, int, float, bool, type(None))
_LENGTH = struct.Struct("<I")


class LinkProtocolError(ValueError):
    """Bytes or data that are not a message of the engine link."""


# -- plain data <-> bytes --------------------------------------------------------------------------------------


def encode(data: Any) -> bytes:
    """Plain data -> bytes (see module doc); LinkProtocolError naming the first value that is not plain data."""
    buffers: list[bytes] = []
    tree = _pack(data, buffers, "message")
    header = json.dumps([tree, [len(b) for b in buffers]], separators=(",", ":")).encode()
    return b"".join([_LENGTH.pack(len(header)), header, *buffers])


def _pack(value: Any, buffers: list[bytes], where: str) -> Any:
    if isinstance(value, SCALARS):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        buffers.append(bytes(value))
        return {MARK: [len(buffers) - 1, "B"]}
    if isinstance(value, (list, tuple)):
        kinds = set(map(type, value))
        if len(value) >= MIN_BUFFER and len(kinds) == 1 and (code := BUFFER_TYPES.get(kinds.pop())):
            try:
                buffers.append(array.array(code, value).tobytes())
                return {MARK: [len(buffers) - 1, code]}
            except OverflowError:  # an int beyond 64 bits stays in the JSON
                pass
        return [_pack(v, buffers, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        bad = next((k for k in value if not isinstance(k, str) or k == MARK), None)
        if bad is not None:
            raise LinkProtocolError(f"{where}: key {bad!r} cannot cross the engine link (string keys, not {MARK!r})")
        return {k: _pack(v, buffers, f"{where}.{k}") for k, v in value.items()}
    raise LinkProtocolError(
        f"{where}: a {type(value).__name__} cannot cross the engine link (plain data only: dicts, lists, strings, "
        "numbers, booleans, None, bytes)"
    )


def decode(data: bytes | bytearray | memoryview) -> Any:
    """bytes -> plain data (see module doc); LinkProtocolError when they are not an `encode`d message."""
    view = memoryview(data)
    if len(view) < _LENGTH.size:
        raise LinkProtocolError(f"a link message of {len(view)} bytes, shorter than its header")
    (n,) = _LENGTH.unpack(view[: _LENGTH.size])
    end = _LENGTH.size + n
    try:
        tree, lengths = json.loads(bytes(view[_LENGTH.size : end]))
    except (ValueError, TypeError, RecursionError) as exc:
        raise LinkProtocolError(f"a link message whose header is not one ({exc})") from None
    if not isinstance(lengths, list) or not all(type(k) is int and k >= 0 for k in lengths):
        raise LinkProtocolError("a link message whose buffer lengths are not counts")
    if end + sum(lengths) != len(view):
        raise LinkProtocolError(f"a link message of {len(view)} bytes whose header says {end + sum(lengths)}")
    offsets = [end]
    for k in lengths:
        offsets.append(offsets[-1] + k)
    buffers = [view[a:b] for a, b in zip(offsets, offsets[1:], strict=False)]
    try:
        return _unpack(tree, buffers)
    except RecursionError:
        raise LinkProtocolError("a link message nested too deeply") from None


def _unpack(value: Any, buffers: list[memoryview]) -> Any:
    if isinstance(value, list):
        return [_unpack(v, buffers) for v in value]
    if not isinstance(value, dict):
        return value
    if MARK not in value:
        return {k: _unpack(v, buffers) for k, v in value.items()}
    ref = value[MARK]
    if len(value) != 1 or not isinstance(ref, list) or len(ref) != 2 or type(ref[0]) is not int:
        raise LinkProtocolError(f"a link message with a malformed buffer reference {value!r}")
    index, code = ref
    if not 0 <= index < len(buffers) or code not in ("q", "d", "b", "B"):
        raise LinkProtocolError(f"a link message with a buffer reference out of range {value!r}")
    raw = buffers[index]
    if code == "B":
        return bytes(raw)
    items = array.array(code)
    if len(raw) % items.itemsize:
        raise LinkProtocolError(f"a buffer of {len(raw)} bytes is not a whole number of {code!r} items")
    items.frombytes(raw)
    return list(map(bool, items)) if code == "b" else items.tolist()


# -- typed values <-> plain data -------------------------------------------------------------------------------


def to_plain(value: Any) -> Any:
    """Dataclasses -> dicts of their fields, tuples -> lists, torch dtypes -> their names ("bfloat16"), recursively;
    lists of scalars are taken as they are (no walk over every token)."""
    if isinstance(value, SCALARS) or isinstance(value, (bytes, bytearray)):
        return value
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        if set(map(type, value)) <= set(SCALARS):
            return list(value)
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    raise LinkProtocolError(f"a {type(value).__name__} cannot cross the engine link")


def from_plain(value: Any, hint: Any, key: str) -> Any:
    """`value` (plain data) as type `hint`: dataclasses from mappings of their fields, tuples from lists, dtypes
    from names; LinkProtocolError naming `key` (dotted to the field) when it does not fit."""
    try:
        return _typed(value, hint, key)
    except LinkProtocolError:
        raise
    except (ValueError, TypeError) as exc:
        raise LinkProtocolError(str(exc)) from None


def _typed(value: Any, hint: Any, key: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _dataclass(value, hint, key)
    if hint is torch.dtype:
        dtype = getattr(torch, value, None) if isinstance(value, str) else None
        if not isinstance(dtype, torch.dtype):
            raise LinkProtocolError(f"{key}: expected a torch dtype's name, got {value!r}")
        return dtype
    if origin is tuple:
        if not isinstance(value, list):
            raise LinkProtocolError(f"{key}: expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_typed(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise LinkProtocolError(f"{key}: expected {len(args)} items, got {len(value)}")
        return tuple(_typed(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if origin is list and args:
        if not isinstance(value, list):
            raise LinkProtocolError(f"{key}: expected a list, got {type(value).__name__}")
        if args[0] in (int, float, str) and set(map(type, value)) <= {args[0]}:
            return _checked_scalars(value, args[0], key)
        return [_typed(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    return coerce(value, hint, key)


def _checked_scalars(value: list, kind: type, key: str) -> list:
    """A list of one scalar type, checked as a whole (a prompt's ids, not one at a time)."""
    if kind is int and value and (min(value) <= -(2**63) or max(value) >= 2**63):
        raise LinkProtocolError(f"{key}: an item beyond a 64-bit integer")
    return value


def _dataclass(value: Any, cls: type, key: str) -> Any:
    if not isinstance(value, dict):
        raise LinkProtocolError(f"{key}: expected a mapping of {cls.__name__}'s fields, got {type(value).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - set(fields))
    missing = [n for n, f in fields.items() if n not in value and _required(f)]
    if unknown or missing:
        raise LinkProtocolError(f"{key}: {cls.__name__} with unknown field(s) {unknown}, missing {missing}")
    hints = typing.get_type_hints(cls)
    return cls(**{name: _typed(v, hints[name], f"{key}.{name}") for name, v in value.items()})


def _required(field: dataclasses.Field) -> bool:
    return field.init and field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING

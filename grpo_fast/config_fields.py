"""Config fields that carry their own type, default, bounds and help, and the base of mutable config sections.

A field is a dataclass field whose metadata holds its `help` and, where the value is restricted, its `choices`
and `bounds` (the convention of transformers' and TRL's argument dataclasses, read by the same tools):

    @dataclass
    class RunConfig(ConfigSection):
        key = "run"
        max_steps: int = option(100, "optimizer steps of the run", low=1)
        packing: bool | Auto = option("auto", "pack sequences padding-free (auto: where the probe allows)")

`check_field` enforces a field's type (Literal types are choices; a float must be finite), choices and bounds
wherever a value arrives: from YAML or a dict (`build`, through grpo_fast.core.config_tree) and on every assignment to a
`ConfigSection` from Python, where an unknown attribute raises too, naming the key's new home when it moved
(a silent new attribute would change nothing). Rules between fields stay in each tree's own `validate`.
Tri-state options are `bool | Auto`: true, false or "auto"; the old strings "true" / "false" are read with a
warning.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import logging
import math
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

logger = logging.getLogger(__name__)

Auto = Literal["auto"]
"""The third state of a tri-state option (`bool | Auto`): decided at run time, the choice logged."""


@dataclass(frozen=True)
class Bounds:
    """low <= value <= high (an open end excludes the bound itself; None: unbounded on that side)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def admits(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or not (value > self.high or (self.high_open and value == self.high))

    def text(self) -> str:
        """ "> 0", ">= 1", "in [0, 1)" ..."""
        low, high = _number(self.low), _number(self.high)
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {low}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {high}"
        return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def _number(x: float | None) -> str:
    """A bound as written: whole numbers in full (4294967295, not 4.29497e+09), others shortest."""
    if x is None:
        return ""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


MAX_WAIT_SECONDS = 1e6
"""The longest timeout an option takes (11.6 days): waits reach the OS in milliseconds as C ints (at most 24.8 days),
and a larger one overflowed there or, in gloo, became an instant timeout."""


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",  # noqa: A002 (the metadata key of transformers' argument dataclasses)
    *,
    factory: Callable[[], Any] | None = None,
    choices: Iterable[str] | Callable[[], Iterable[str]] | Any | None = None,
    also: tuple[str, ...] = (),
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> Any:
    """A dataclass field with its help, choices (a collection, a function giving the current ones, or a registry —
    grpo_fast.registry.Registry: its names, or "package.module:attribute", loaded and checked when the value is set —
    with `also` further values it admits, such as "auto") and bounds; `factory` for mutable defaults."""
    metadata: dict[str, Any] = {"help": " ".join(help.split())}
    if _is_registry(choices):
        metadata["registry"], metadata["also"] = choices, tuple(also)
    elif choices is not None:
        metadata["choices"] = choices if callable(choices) else tuple(choices)
    if low is not None or high is not None:
        metadata["bounds"] = Bounds(low, high, low_open, high_open)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved type hints of a dataclass's fields."""
    return typing.get_type_hints(cls)


def choices_of(field: dataclasses.Field) -> tuple | None:
    """A field's allowed values: its `choices` (a registry's: its names and the path spelling), or the values of a
    Literal type; None when unrestricted."""
    registry = field.metadata.get("registry")
    if registry is not None:
        return (*field.metadata["also"], *registry.names(), "package.module:attribute")
    choices = field.metadata.get("choices")
    if callable(choices):
        return tuple(choices())
    return choices


def check_field(cls: type, name: str, value: Any, key: str, from_text: bool = False) -> Any:
    """`value` for field `name` of dataclass `cls`, converted to its declared type where lossless (int -> float, a
    nested mapping -> its section; with `from_text`, a config file's "3e-4", which YAML 1.1 reads as a string, ->
    3e-4); ValueError naming `key` for anything else."""
    field = cls.__dataclass_fields__[name]
    value = coerce(value, field_types(cls)[name], key, from_text)
    registry = field.metadata.get("registry")
    if registry is not None and value is not None and value not in field.metadata["also"]:
        registry.get(value, key=key)  # a registered name, or "package.module:attribute" that loads and passes
        return value
    choices = None if registry is not None else choices_of(field)
    if choices is not None and value is not None and value not in choices:
        raise ValueError(f"{key}: expected one of {choices}, got {value!r}")
    bounds = field.metadata.get("bounds")
    if bounds is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not bounds.admits(value):
            raise ValueError(f"{key}: expected a value {bounds.text()}, got {value!r}")
    return value


def _is_registry(choices: Any) -> bool:
    """Whether `choices` is a registry (grpo_fast.registry.Registry, by its interface: this layer imports none)."""
    return callable(getattr(choices, "names", None)) and callable(getattr(choices, "get", None))


def coerce(value: Any, hint: Any, key: str, from_text: bool = False) -> Any:
    """`value` as type `hint` (see check_field); ValueError naming `key` when it is not one."""
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if value is None:  # an empty section in YAML
            value = {}
        if not isinstance(value, dict):
            raise ValueError(f"{key}: expected a mapping of {hint.__name__}'s options, got {type(value).__name__}")
        return build(hint, value, key)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, typing.get_args(hint), key, from_text)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ValueError(f"{key}: expected one of {allowed}, got {value!r}")
        return value
    if hint is Any:
        return value
    if origin is list and typing.get_args(hint):
        if not isinstance(value, list):
            raise ValueError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        (item,) = typing.get_args(hint)
        return [coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    target = origin or hint
    if target is float:
        return _float(value, key, from_text)
    if target is int and isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        raise ValueError(f"{key}: {value} is out of range (beyond a 64-bit integer)")
    if target in (list, dict, str, int, bool) or (isinstance(target, type) and target is not object):
        if not isinstance(value, target) or (target is int and isinstance(value, bool)):
            raise ValueError(f"{key}: expected {target.__name__}, got {type(value).__name__} {value!r}")
    if target is dict:
        _require_plain(value, key)
    return value


_PLAIN = (type(None), bool, int, float, str)


def _require_plain(value: Any, key: str) -> None:
    """ValueError naming the entry of a free-form mapping that is not a plain value (a string, number, boolean, null,
    list or mapping of them): YAML reads 2024-01-01 as a date, !!set and !!binary as a set and bytes, which a
    config written as JSON (the run signature, --print-config) cannot hold."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, _PLAIN):
                raise ValueError(f"{key}: expected plain keys (strings or numbers), got {type(k).__name__} {k!r}")
            _require_plain(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _require_plain(v, f"{key}[{i}]")
    elif not isinstance(value, _PLAIN):
        raise ValueError(
            f"{key}: expected a string, number, boolean, null, list or mapping, got {type(value).__name__} {value!r}"
            + ("; quote it to keep it as text" if isinstance(value, (datetime.date, bytes)) else "")
        )


def _coerce_union(value: Any, args: tuple, key: str, from_text: bool) -> Any:
    if value is None and type(None) in args:
        return None
    if bool in args and Literal["auto"] in args and value in ("true", "false"):  # the old tri-state strings
        logger.warning("%s: the string %r is the old spelling; write %s (a boolean)", key, value, value)
        return value == "true"
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return coerce(value, arg, key, from_text)
        except ValueError as exc:
            errors.append(str(exc))
    if len(errors) == 1:
        raise ValueError(errors[0])
    names = " or ".join(_type_text(a) for a in args)
    raise ValueError(f"{key}: expected {names}, got {type(value).__name__} {value!r}")


def _float(value: Any, key: str, from_text: bool) -> float:
    if isinstance(value, str) and from_text:
        try:  # YAML 1.1 reads "3e-4" (no dot) as a string
            value = float(value)
        except ValueError:
            raise ValueError(f"{key}: expected float, got str {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key}: expected float, got {type(value).__name__} {value!r}")
    if isinstance(value, int) and abs(value) >= 2**63:
        raise ValueError(f"{key}: {value} is out of range (beyond a 64-bit integer)")
    if not math.isfinite(value):
        raise ValueError(f"{key}: expected a finite number, got {value!r}")
    return float(value)


def _type_text(hint: Any) -> str:
    """A type as a config reader writes it: "int", "float | null", "bool | auto", "token | sequence"."""
    if hint is type(None):
        return "null"
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a) for a in typing.get_args(hint))
    if origin is Literal:
        return " | ".join(str(a) for a in typing.get_args(hint))
    if dataclasses.is_dataclass(hint):
        return "section"
    if origin is list and typing.get_args(hint):
        return f"list[{_type_text(typing.get_args(hint)[0])}]"
    return getattr(origin or hint, "__name__", str(hint))


def type_text(cls: type, name: str) -> str:
    """Field `name` of `cls`'s type, as `--help-config` prints it."""
    return _type_text(field_types(cls)[name])


class ConfigSection:
    """Base of the mutable config sections (dataclasses): every assignment is checked (`check_field`), and an
    unknown attribute raises instead of silently becoming a new one; `MOVED` names where an old option lives now.

    key: the section's dotted key in its tree ("run", "rollout.vllm"), for messages."""

    key: ClassVar[str] = ""
    MOVED: ClassVar[dict[str, str]] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        fields = self.__dataclass_fields__
        if name not in fields:
            where = f"{self.key}.{name}" if self.key else name
            if name in self.MOVED:
                raise AttributeError(f"{where}: no such option; it is {self.MOVED[name]} now")
            raise AttributeError(f"{where}: no such option; expected one of {sorted(fields)}")
        object.__setattr__(self, name, check_field(type(self), name, value, f"{self.key}.{name}" if self.key else name))


def build(cls: type, data: dict, key: str = "") -> Any:
    """The dataclass `cls` from a mapping of its options (nested sections from nested mappings), every value
    checked; unknown keys raise, naming a moved option's new home, and so does a missing field without a default.
    Errors name the dotted key under `key`."""
    fields = cls.__dataclass_fields__
    moved = getattr(cls, "MOVED", {})
    unknown = sorted(map(str, set(data) - set(fields)))
    for name in unknown:
        if name in moved:
            raise ValueError(f"{_join(key, name)}: no such option; it is {moved[name]} now")
    if unknown:
        raise ValueError(f"{key or 'config'}: unknown key(s) {unknown}; valid keys: {sorted(fields)}")
    for name, field in fields.items():
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        if required and name not in data:
            raise ValueError(f"{_join(key, name)}: required ({field.metadata.get('help') or type_text(cls, name)})")
    kwargs = {name: check_field(cls, name, value, _join(key, name), from_text=True) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as exc:  # a section's own rules name the key within the section
        message = str(exc)
        raise ValueError(message if not key or message.startswith(f"{key}.") else f"{key}.{message}") from None


def check_fields(obj: Any, key: str = "") -> None:
    """Checks (and converts) every field of a frozen dataclass in place, from its __post_init__; ValueError
    naming the field under `key`."""
    for name in obj.__dataclass_fields__:
        object.__setattr__(obj, name, check_field(type(obj), name, getattr(obj, name), _join(key, name)))


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name

"""The one plug-in mechanism: name -> object registries (loss types, objectives, backends, rollout engines, reward
functions, tools, environments), each with its contract checked when an entry arrives.

Built-in entries are "module:attribute" strings imported on first use, so naming or listing an entry imports
nothing (vLLM, math-verify ... load only when their entry is used). A plug-in either registers itself
(`REGISTRY.register(name, obj)`, in a module the config's `imports` list names) or is named directly as
"package.module:attribute" wherever a name is accepted (a YAML config, a keyword argument), without registering.

Every entry passes its registry's contract (`contract(name, obj) -> obj`, a TypeError naming what is missing): at
`register`, or when a built-in or "module:attribute" entry is first loaded. So an incomplete plug-in (an engine
without `load_weights`, an objective without a definition, a backend without `backward`) is refused where it enters,
naming the missing members, not at its first use deep inside a run. An unknown name is a ValueError that lists the
known ones.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

Contract = Callable[[str, Any], Any]
"""(name, obj) -> obj when `obj` fulfils a registry's contract; TypeError naming what is missing otherwise."""

PATH_SPELLING = "package.module:attribute"


class Registry:
    """Entries of one `kind` ("rollout engine", "loss type" ...) by name, each checked by `contract`."""

    def __init__(self, kind: str, builtins: Mapping[str, Any] | None = None, *, contract: Contract | None = None):
        self.kind = kind
        self.contract = contract
        self._entries: dict[str, Any] = {}
        self._by_path: dict[str, Any] = {}  # "module:attribute" names already loaded and checked
        for name, entry in (builtins or {}).items():
            self._entries[name] = entry if isinstance(entry, str) else self._checked(name, entry)

    def register(self, name: str, obj: Any = None) -> Any:
        """Add `obj` under `name`, checked against the contract now; without `obj`, a decorator that does. A name is
        registered once; a built-in's "module:attribute" entry takes the very object it names (its module registers
        it on import)."""
        if obj is None:
            return lambda target: self.register(name, target)
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"{self.kind}: a registered name is a non-empty string without ':', got {name!r}")
        if name in self._entries and self._entries[name] is not obj and self._entries[name] != _location(obj):
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = self._checked(name, obj)
        return obj

    def unregister(self, name: str) -> None:
        """Remove `name` (a plug-in's registration undone, e.g. by a test)."""
        self._entries.pop(name, None)

    def get(self, name: str, key: str | None = None) -> Any:
        """The entry `name` (loaded and checked on first use), or the object a "package.module:attribute" string
        points at; ValueError naming `key` (the config key or argument, when given) and the known names otherwise."""
        where = key or self.kind
        if isinstance(name, str) and name in self._entries:
            entry = self._entries[name]
            if isinstance(entry, str):
                entry = self._entries[name] = self._loaded(name, entry, where)
            return entry
        if isinstance(name, str) and ":" in name:
            if name not in self._by_path:
                self._by_path[name] = self._loaded(name, name, where)
            return self._by_path[name]
        raise ValueError(f"{where}: unknown name {name!r}; expected one of {self.names()} or '{PATH_SPELLING}'")

    def names(self) -> tuple[str, ...]:
        """The registered names, built-ins first (nothing is imported)."""
        return tuple(self._entries)

    def items(self) -> Iterator[tuple[str, Any]]:
        """(name, entry) of every registered name, each loaded."""
        return ((name, self.get(name)) for name in self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, name: str) -> Any:
        if name not in self._entries:
            raise KeyError(name)
        return self.get(name)

    def _checked(self, name: str, obj: Any) -> Any:
        return obj if self.contract is None else self.contract(name, obj)

    def _loaded(self, name: str, location: str, where: str) -> Any:
        """The object at "module:attribute" `location`, checked; a ValueError naming `where` when it does not load
        or breaks the contract (a name in a config is input: its problems are ValueErrors)."""
        obj = _import(location, f"{where}: {self.kind} {name!r}")
        try:
            return self._checked(name, obj)
        except TypeError as err:
            raise ValueError(f"{where}: {err}") from err


def missing_members(obj: Any, members: Iterable[str], callable_members: Iterable[str] = ()) -> list[str]:
    """The names among `members` (attributes) and `callable_members` (methods) that `obj` lacks."""
    absent = [m for m in members if not hasattr(obj, m)]
    return absent + [m for m in callable_members if not callable(getattr(obj, m, None))]


def refuse_missing(kind: str, name: str, missing: list[str], contract: str) -> None:
    """TypeError "<kind> '<name>': missing [...] (<contract>)" when `missing` is not empty."""
    if missing:
        raise TypeError(f"{kind} {name!r}: missing {missing} ({contract})")


def callable_contract(kind: str) -> Contract:
    """The contract of registries of plain callables (reward functions, tools, environment factories)."""

    def check(name: str, obj: Any) -> Any:
        if not callable(obj):
            raise TypeError(f"{kind} {name!r}: expected a callable, got {type(obj).__name__}")
        return obj

    return check


def import_modules(modules: Iterable[str], key: str = "imports") -> None:
    """Import each of `modules` (a config's plug-in modules, whose imports register their entries); ValueError naming
    `key` and the module that fails to import or whose registration a registry refuses."""
    for index, module in enumerate(modules):
        if not isinstance(module, str) or not module or ":" in module:
            raise ValueError(f"{key}[{index}]: expected a module name such as 'my_pkg.losses', got {module!r}")
        try:
            importlib.import_module(module)
        except (ImportError, TypeError, ValueError) as err:
            raise ValueError(f"{key}[{index}]: importing {module!r} failed: {err}") from err


def lazy_exports(package: str, exports: Mapping[str, str]):
    """(__getattr__, __dir__) for a package whose public names load on first use: `exports` maps each name to the
    submodule (relative to `package`) that defines it. Importing the package then imports none of them."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{exports[name]}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__


def _location(obj: Any) -> str | None:
    """ "module:qualname" of a function or class (how built-in entries name them), else None."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname else None


def _import(location: str, what: str) -> Any:
    module, _, attribute = location.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{what}: cannot load {location!r} ({err})") from err

"""Name -> object registries for the pluggable parts (rollout engines, reward functions).

Built-in entries are "module:attribute" strings imported on first use, so naming or listing an
entry imports nothing (vLLM, math-verify ... load only when their entry is used). Plug-ins either
call `register` before the name is used, or are named directly as "package.module:attribute"
(e.g. in a YAML config) without registering at all. An unknown name is an error that lists the
known ones.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any


class Registry:
    """Entries of one `kind` ("rollout engine", "reward function" ...) by name."""

    def __init__(self, kind: str, builtins: Mapping[str, str]):
        self.kind = kind
        self._entries: dict[str, Any] = dict(builtins)

    def register(self, name: str, obj: Any = None) -> Any:
        """Add `obj` under `name`; without `obj`, a decorator that does. A name is registered once; a built-in's
        "module:attribute" entry takes the very object it names (its module registers it on import)."""
        if obj is None:
            return lambda target: self.register(name, target)
        if name in self._entries and self._entries[name] not in (obj, _location(obj)):
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = obj
        return obj

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str) -> Any:
        """The entry `name`, or the object a "package.module:attribute" string points at."""
        if name in self._entries:
            entry = self._entries[name]
            if isinstance(entry, str):
                entry = self._entries[name] = _import(entry, f"{self.kind} {name!r}")
            return entry
        if isinstance(name, str) and ":" in name:
            return _import(name, f"{self.kind} {name!r}")
        raise ValueError(
            f"{self.kind}: unknown name {name!r}; expected one of {sorted(self._entries)} or 'package.module:attribute'"
        )


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

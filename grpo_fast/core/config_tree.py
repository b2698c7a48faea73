"""Config trees (dataclasses of sections of `grpo_fast.config_fields` fields): loading from YAML or a dict with
`--set key=value` overrides, old spellings upgraded with a warning, and the reference of every key (for
`--help-config` and docs/config.md) generated from the fields themselves.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from grpo_fast.config_fields import build, choices_of, type_text
from grpo_fast.registry import import_modules

logger = logging.getLogger(__name__)

Upgrade = Callable[[dict], list[str]]
"""Rewrites a tree's raw nested dict in place from an old spelling to the current one; returns a warning per
change."""


def load_tree(
    cls: type,
    source: str | Path | dict | None = None,
    overrides: list[str] | None = None,
    upgrades: tuple[Upgrade, ...] = (),
):
    """The config tree `cls` from a YAML file or a nested dict (copied, not modified), then `--set key=value`
    overrides; `upgrades` turn old spellings into current ones, each with a logged warning. A tree with an `imports`
    key imports those modules first, so that the plug-ins they register are known when the sections are read."""
    data: dict = {}
    if isinstance(source, dict):
        data = copy.deepcopy(source)
    elif source is not None:
        data = read_yaml(source)
        data = {} if data is None else data
    if not isinstance(data, dict):
        raise ValueError(f"config: expected a mapping, got {type(data).__name__}")
    data = apply_overrides(data, overrides or [])
    for upgrade in upgrades:
        for warning in upgrade(data):
            logger.warning("config: %s", warning)
    if "imports" in cls.__dataclass_fields__ and isinstance(data.get("imports"), list):
        import_modules(data["imports"])
    return build(cls, data)


def move_key(data: dict, old: str, new: str) -> list[str]:
    """Moves the dotted key `old` of a nested dict to `new` (an Upgrade's step); a warning when it was there.
    Both spellings at once is an error."""
    *old_path, old_name = old.split(".")
    parent = _section(data, old_path)
    if parent is None or old_name not in parent:
        return []
    *new_path, new_name = new.split(".")
    target = data
    for part in new_path:
        target = target.setdefault(part, {})
        if not isinstance(target, dict):
            raise ValueError(f"{'.'.join(new_path)}: expected a mapping, got {type(target).__name__}")
    if new_name in target:
        raise ValueError(f"{old}: the old spelling of {new}; set only {new}")
    target[new_name] = parent.pop(old_name)
    return [f"{old} is the old spelling of {new}; write {new}"]


def _section(data: dict, path: list[str]) -> dict | None:
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else None


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """`key.sub=value` strings (value parsed as YAML) merged into the nested dict `data`."""
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        value = parse_yaml(raw, f"--set {key}: the value {raw!r}", keep_comments=True) if raw.strip() else ""
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {part!r} is not a section")
        node[parts[-1]] = value
    return data


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]


MAX_YAML_VALUES = 1_000_000
"""The most values a config file may hold once its aliases are expanded (a config is copied, compared and written
as JSON, each alias as often as it is used: nine levels of nine aliases are 387 million values from 400 bytes)."""


def read_yaml(source: str | Path):
    """The YAML file `source` as Python data (`parse_yaml`); FileNotFoundError when there is none; ValueError naming
    the file when it cannot be read, for bytes that are not UTF-8 text, or what `parse_yaml` refuses."""
    try:
        text = Path(source).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"config file {source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except FileNotFoundError:
        raise
    except OSError as exc:  # a directory, a path through a file, a name too long, a device that cannot be read
        raise ValueError(f"config file {source}: cannot be read ({exc.strerror or exc}); name a YAML file") from None
    return parse_yaml(text, f"config file {source}")


def parse_yaml(text: str, what: str, keep_comments: bool = False):
    """`text` as Python data, read with PyYAML's safe loader (plain values only: a `!!python/...` tag is an error,
    never a call); ValueError starting with `what` for text that is not YAML, a key given twice in one mapping
    (PyYAML would keep the last silently), nesting deeper than the parser goes, or aliases that expand past
    MAX_YAML_VALUES. `keep_comments` (one value on a command line): a plain string with " #..." after it is kept
    whole (YAML would drop that as a comment: `runs/exp #2` is not `runs/exp`); any other value followed by a
    comment is refused."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return text.strip() if keep_comments else None  # a value that is all comment: "#1" kept as written
        if (size := _expanded_size(node, {})) > MAX_YAML_VALUES:
            raise ValueError(f"{what}: its aliases expand to more than {MAX_YAML_VALUES} values ({size})")
        if (twice := _repeated_key(node, set())) is not None:
            raise ValueError(
                f"{what}, line {twice.start_mark.line + 1}: {twice.value!r} is given twice in one mapping (only the "
                "last would count); keep one"
            )
        if keep_comments and text[node.end_mark.index :].strip():
            if isinstance(node, yaml.ScalarNode) and node.style is None and node.tag == "tag:yaml.org,2002:str":
                return text.strip()
            raise ValueError(f"{what}: YAML reads its ' #...' as a comment and drops it; quote the value")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ValueError(f"{what}: not valid YAML ({_first_line(exc)})") from None
    except RecursionError:
        raise ValueError(f"{what}: nested deeper than the YAML parser goes") from None
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values `node` holds with every alias expanded (each shared node counted once per use, computed
    once)."""
    if id(node) not in sizes:
        children = node.value if isinstance(node, yaml.SequenceNode) else []
        if isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        sizes[id(node)] = 1 + sum(_expanded_size(child, sizes) for child in children)
    return sizes[id(node)]


def _repeated_key(node: yaml.Node, seen: set[int]) -> yaml.ScalarNode | None:
    """The first key that repeats an earlier key of its mapping, anywhere under `node` (each node visited once)."""
    if id(node) in seen:
        return None
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        names: set[str] = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value != "<<":  # "<<": YAML's merge key, repeatable
                if key.value in names:
                    return key
                names.add(key.value)
    children = node.value if isinstance(node, yaml.SequenceNode) else []
    if isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    return next((found for child in children if (found := _repeated_key(child, seen)) is not None), None)


# -- the reference of every key ----------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyDoc:
    """One option of a tree: dotted key, type, default, help, and its constraint ("> 0", "one of (...)")."""

    key: str
    type: str
    default: Any
    help: str
    constraint: str


def iter_keys(tree: Any, prefix: str = "") -> Iterator[KeyDoc]:
    """Every leaf option of a config tree (an instance, or a class built with its defaults), depth first in
    declaration order, with the tree's defaults."""
    tree = tree() if isinstance(tree, type) else tree
    for field in dataclasses.fields(tree):
        key = f"{prefix}.{field.name}" if prefix else field.name
        value = getattr(tree, field.name)
        if dataclasses.is_dataclass(value):
            yield from iter_keys(value, key)
            continue
        choices, bounds = choices_of(field), field.metadata.get("bounds")
        constraint = f"one of {', '.join(map(str, choices))}" if choices else (bounds.text() if bounds else "")
        yield KeyDoc(key, type_text(type(tree), field.name), value, field.metadata.get("help", ""), constraint)


def help_text(cls: type) -> str:
    """`--help-config`: one paragraph per key."""
    lines = []
    for doc in iter_keys(cls):
        constraint = f"; {doc.constraint}" if doc.constraint else ""
        lines.append(f"{doc.key} ({doc.type}{constraint}; default {_yaml(doc.default)})")
        lines.append(f"    {doc.help}" if doc.help else "    (no help)")
    return "\n".join(lines) + "\n"


def markdown_tables(tree: Any, sections: tuple[str, ...] | None = None, heading: str = "##") -> str:
    """One Markdown table per top-level section of a config tree (only `sections` when given), for docs."""
    out, current = [], None
    for doc in iter_keys(tree):
        top = doc.key.split(".")[0]
        if sections is not None and top not in sections:
            continue
        if top != current:
            current = top
            out += ["", f"{heading} `{top}`", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        constraint = f" ({doc.constraint})" if doc.constraint else ""
        cells = [f"`{doc.key}`", doc.type, f"`{_yaml(doc.default)}`", doc.help + constraint]
        out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(out).lstrip("\n") + "\n"


def _yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**9).strip().removesuffix("...").strip()

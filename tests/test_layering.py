"""The package layering as a contract: every import of the package — at module level or inside a function — goes
from a package to one in a lower layer (or stays inside its own package), so there is no package-level cycle.

Strings that a registry imports on first use ("grpo_fast.rewards.tasks:exact_match_reward") are plug-in points,
not imports of the importing package, and are not counted. docs/architecture.md draws the same layers.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = (
    ("cli",),
    ("pipeline", "bench"),
    ("demo",),
    ("trainer",),
    ("curate", "sft"),
    ("core", "integrations", "testing"),
    ("rollout", "rewards"),
    ("data", "distributed"),
    ("loss",),
    ("backends",),
    ("kernels", "sandbox"),
    ("config_fields", "registry", "machine", "errors"),
)
"""From the top (imports others) to the bottom (imports no other package of grpo_fast)."""


def _sources() -> dict[str, Path]:
    """module name -> file, with kernels/ shipped as grpo_fast.kernels."""
    modules = {}
    for base, package in ((ROOT / "grpo_fast", "grpo_fast"), (ROOT / "kernels", "grpo_fast.kernels")):
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def _imported_modules(module: str, path: Path) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import in the file, wherever it stands."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((target, node.lineno))
    return found


def _package(module: str) -> str | None:
    """grpo_fast.X.... -> X (a subpackage, or a module at the package root); None outside grpo_fast."""
    parts = module.split(".")
    if parts[0] != "grpo_fast":
        return None
    return parts[1] if len(parts) > 1 else ""


def package_imports() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the places, for imports between different packages."""
    edges = defaultdict(list)
    for module, path in _sources().items():
        source = _package(module)
        for target, line in _imported_modules(module, path):
            imported = _package(target)
            if imported is None or imported in ("", source) or source == "":
                continue
            edges[(source, imported)].append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    return edges


def test_every_package_has_a_layer():
    packages = {_package(m) for m in _sources()} - {""}
    layered = {p for layer in LAYERS for p in layer}
    assert packages <= layered, f"packages without a layer in LAYERS: {sorted(packages - layered)}"


def test_imports_only_go_down_the_layers():
    depth = {package: i for i, layer in enumerate(LAYERS) for package in layer}
    upward = [
        f"{source} (layer {depth[source]}) -> {imported} (layer {depth[imported]}): {places[0]}"
        for (source, imported), places in sorted(package_imports().items())
        if depth[imported] <= depth[source]
    ]
    assert not upward, "imports that do not go down the layers:\n" + "\n".join(upward)


def test_no_package_level_cycle():
    """Independent of LAYERS: the package graph has no strongly connected component of more than one package."""
    graph = defaultdict(set)
    for source, imported in package_imports():
        graph[source].add(imported)
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    assert not cycles, f"package-level import cycles: {cycles}"


def test_no_function_longer_than_80_lines():
    """docs/architecture.md: a function past 80 lines (decorators and docstring included) holds two jobs."""
    sources = [
        *(ROOT / "grpo_fast").rglob("*.py"),
        *(ROOT / "benchmarks").glob("*.py"),
        *(ROOT / "scripts").glob("*.py"),
    ]
    long = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if node.end_lineno - start + 1 > 80:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not long, long

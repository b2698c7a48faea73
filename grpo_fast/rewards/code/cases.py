"""The `tests` column of code rewards: hidden test cases, and what each needs from the program.

Formats of one row's `tests` (a JSON string of any of these is accepted too):
- Python assert tests: ["assert add(1, 2) == 3", "s = Stack()\\ns.push(1)\\nassert s.pop() == 1"]. Each
  string is one test, any Python with at least one assert (or raise) statement; it passes when it
  runs to the end. It runs in the judge, a clean interpreter (judge_runner.py); the program is only asked for
  the calls the test makes of it.
- stdin/stdout pairs: [{"input": "1 2\\n", "output": "3\\n"}, ...], or {"inputs": [...], "outputs": [...]}
  (APPS / TACO layout). The program reads `input` on stdin; its stdout must equal `output` up to
  trailing whitespace on each line and trailing blank lines.

The names an assert test uses without binding them are resolved in the judge as: the real builtins;
the real module or class of `KNOWN` (`math`, `re`, `Counter`, `np`, ...: names tests commonly use
without importing them, which a program must not be able to define for the test); else the
program's globals (its functions, classes and constants). The program's process also gets the
test's `SEEDS` calls with literal arguments (`random.seed(0)`, `sys.setrecursionlimit(10**6)`),
which set up its environment; nothing else of the test.

A test that would hand program output to code execution in the judge (eval, exec, compile,
__import__, breakpoint, or the modules of `_CODE_MODULES`) cannot be judged: it fails for every
program, with a warning. So does a test that compares values which all come from the program
(`f(x) == g(x)`, `f(3) == f(3)`, `f(3) == EXPECTED` with EXPECTED the program's, a test variable or a
helper's argument bound to a program value): a wrong program chooses both sides and passes
(`program_only_comparison`).
"""

from __future__ import annotations

import ast
import builtins
import functools
import json
import logging
import symtable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

KNOWN = {
    **{name: name for name in "math re random itertools functools collections heapq bisect string operator".split()},
    **{name: name for name in "fractions decimal statistics json copy typing sys".split()},
    "np": "numpy",
    "numpy": "numpy",
    **{name: f"collections:{name}" for name in "Counter defaultdict OrderedDict deque namedtuple".split()},
    "Fraction": "fractions:Fraction",
    "Decimal": "decimal:Decimal",
    "reduce": "functools:reduce",
    "lru_cache": "functools:lru_cache",
    **{name: f"typing:{name}" for name in "List Dict Tuple Set Optional Any Union".split()},
}
"""Names the judge resolves to real modules and objects when a test uses them without binding them."""
SEEDS = frozenset({"random.seed", "numpy.random.seed", "sys.setrecursionlimit", "sys.set_int_max_str_digits"})
_CODE_NAMES = frozenset({"eval", "exec", "compile", "__import__", "breakpoint"})
_CODE_MODULES = frozenset("pickle marshal shelve dill cloudpickle importlib ctypes code codeop subprocess".split())
_BUILTINS = frozenset(dir(builtins))


@dataclass(frozen=True)
class IOCase:
    """One stdin/stdout test."""

    input: str
    output: str


@dataclass(frozen=True)
class AssertCase:
    """One assert test: its source, the program's names it uses, the `KNOWN` names it uses, its seeding
    prelude for the program's process, and `problem` (why it cannot be judged; it then fails)."""

    test: str
    program: tuple[str, ...] = ()
    known: tuple[tuple[str, str], ...] = ()
    prelude: str = ""
    problem: str | None = None

    def message(self, cpu_s: float) -> dict[str, Any]:
        """The judge's request to run this test (judge_runner.py)."""
        return {"test": self.test, "program": list(self.program), "known": dict(self.known), "cpu_s": cpu_s}


def parse_cases(tests: Any) -> list[AssertCase] | list[IOCase]:
    """The row's tests as AssertCases or IOCases (one kind per row). Raises ValueError naming `tests`."""
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except ValueError:
            tests = [tests]
    if isinstance(tests, dict) and {"inputs", "outputs"} <= tests.keys():
        tests = [{"input": i, "output": o} for i, o in zip(tests["inputs"], tests["outputs"], strict=True)]
    if not isinstance(tests, (list, tuple)):
        raise ValueError(f"tests: expected a list of asserts or of input/output dicts, got {type(tests).__name__}")
    if all(isinstance(t, str) for t in tests):
        return [parse_assert(t) for t in tests]
    if all(isinstance(t, dict) and {"input", "output"} <= t.keys() for t in tests):
        return [IOCase(_as_text(t["input"]), _as_text(t["output"])) for t in tests]
    raise ValueError("tests: mix of kinds, or dicts without 'input' and 'output'")


@functools.lru_cache(maxsize=4096)
def parse_assert(test: str) -> AssertCase:
    """One assert test (see module doc). Raises ValueError when it is not Python or can never fail (no
    assert or raise statement)."""
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError) as exc:
        raise ValueError(f"tests: not valid Python: {test!r:.200} ({exc})") from None
    if not any(isinstance(node, (ast.Assert, ast.Raise)) for node in ast.walk(tree)):
        raise ValueError(f"tests: each test needs an assert statement: {test!r:.200}")
    free = sorted(_free_names(test) - _BUILTINS)
    known = tuple((name, KNOWN[name]) for name in free if name in KNOWN)
    program = tuple(name for name in free if name not in KNOWN)
    problem = _code_execution(tree) or program_only_comparison(tree, set(program))
    if problem:
        log.warning("code_tests: this test fails for every program, it cannot be judged (%s): %.300r", problem, test)
        return AssertCase(test, problem=problem)
    return AssertCase(test, program, known, _prelude(tree))


def _code_execution(tree: ast.AST) -> str | None:
    """Why the test could run program output as code in the judge, or None."""
    for node in ast.walk(tree):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name in _CODE_NAMES:
            return f"it uses {name}"
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        modules += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        for module in modules:
            if module.split(".")[0] in _CODE_MODULES:
                return f"it imports {module}"
    return None


def program_only_comparison(tree: ast.Module, program: set[str]) -> str | None:
    """Why the test compares values that all come from the program (see module doc), or None. A value comes from
    the program when it reads a program name or a test name bound from such a value (assignments, loop and `with`
    targets, comprehensions, `:=`, and the parameters of a helper called with one; an unpacked tuple, `zip` and
    `enumerate` element by element), flow-insensitively; an index (`expected[i]`) carries no value of its own."""
    tainted, helpers = set(program), _helper_parameters(tree)
    while True:
        grown = set(tainted)
        for node in ast.walk(tree):
            for target, value in _bindings(node):
                if _carries(value, grown):
                    grown |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in helpers:
                if any(_carries(arg, grown) for arg in [*node.args, *(k.value for k in node.keywords)]):
                    grown |= helpers[node.func.id]
        if grown == tainted:
            break
        tainted = grown
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and all(_carries(o, tainted) for o in [node.left, *node.comparators]):
            return f"it compares values that all come from the program: {ast.unparse(node)[:120]}"
    return None


def _helper_parameters(tree: ast.Module) -> dict[str, set[str]]:
    """{name of a function the test defines: its parameter names}."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
            if not isinstance(node, ast.Lambda):
                found[node.name] = names
    return found


def _bindings(node: ast.AST) -> list[tuple[ast.expr, ast.expr]]:
    """(target, value) pairs a statement or expression binds, a tuple unpacked element by element where the value
    is a literal tuple, a zip(...) or an enumerate(...)."""
    if isinstance(node, ast.Assign):
        pairs = [(t, node.value) for t in node.targets]
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
        pairs = [(node.target, node.value)]
    elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        pairs = [(node.target, _element(node.iter))]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        pairs = [(node.optional_vars, node.context_expr)]
    else:
        return []
    out = []
    for target, value in pairs:
        parts = value.elts if isinstance(value, (ast.Tuple, ast.List)) else None
        if isinstance(target, (ast.Tuple, ast.List)) and parts is not None and len(parts) == len(target.elts):
            out += [(t, v) for t, v in zip(target.elts, parts, strict=True) if not isinstance(t, ast.Starred)]
        else:
            out.append((target, value))
    return out


def _element(iterable: ast.expr) -> ast.expr:
    """What one element of a loop's iterable is made of: zip(a, b) -> (a, b); enumerate(a) -> (0, a)."""
    if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and not iterable.keywords:
        if iterable.func.id == "zip":
            return ast.Tuple(elts=list(iterable.args))
        if iterable.func.id == "enumerate" and iterable.args:
            return ast.Tuple(elts=[ast.Constant(0), iterable.args[0]])
    return iterable


def _carries(expr: ast.expr, tainted: set[str]) -> bool:
    """Whether `expr` reads a tainted name other than as an index."""
    if isinstance(expr, ast.Name):
        return expr.id in tainted
    if isinstance(expr, ast.Subscript):
        return _carries(expr.value, tainted)
    return any(_carries(child, tainted) for child in ast.iter_child_nodes(expr) if isinstance(child, ast.expr))


def _free_names(source: str) -> set[str]:
    """Global names the test reads (also in the functions, classes and comprehensions it defines) and
    never binds at module level."""
    table = symtable.symtable(source, "<test>", "exec")
    read, bound = set(), set()
    for symbol in table.get_symbols():
        if symbol.is_referenced():
            read.add(symbol.get_name())
        if symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace():
            bound.add(symbol.get_name())
    scopes = list(table.get_children())
    while scopes:
        scope = scopes.pop()
        scopes.extend(scope.get_children())
        for symbol in scope.get_symbols():
            if symbol.is_global() and symbol.is_referenced():
                read.add(symbol.get_name())
            if symbol.is_declared_global() and symbol.is_assigned():
                bound.add(symbol.get_name())
    return read - bound


def _prelude(tree: ast.Module) -> str:
    """The test's module-level `SEEDS` calls with literal arguments, after the imports they need."""
    modules: dict[str, str] = {}  # name bound by an import -> the module it is
    imports: dict[str, ast.stmt] = {}
    calls = []
    for statement in tree.body:
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                modules[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
                imports[alias.asname or alias.name.split(".")[0]] = ast.Import([alias])
        call = statement.value if isinstance(statement, ast.Expr) else None
        if not isinstance(call, ast.Call) or call.keywords:
            continue
        dotted = _dotted(call.func)
        if dotted is None or dotted[0] not in modules or not all(_literal(a) for a in call.args):
            continue
        if ".".join([modules[dotted[0]], *dotted[1:]]) in SEEDS:
            calls.append((dotted[0], statement))
    used = dict.fromkeys(name for name, _ in calls)
    return "\n".join([ast.unparse(imports[name]) for name in used] + [ast.unparse(s) for _, s in calls])


def _dotted(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else [*inner, node.attr]
    return None


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _as_text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def same_output(got: str, expected: str) -> bool:
    """stdout comparison: equal up to trailing whitespace per line and trailing blank lines."""

    def norm(s: str) -> list[str]:
        return [line.rstrip() for line in s.rstrip().splitlines()]

    return norm(got) == norm(expected)

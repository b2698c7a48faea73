"""How an assert test is split between the candidate's interpreter, a clean interpreter and the judge.

A test is setup statements and one or more `assert` statements (formats: cases.py). Walking it in
order, every name is one of:
- trusted: a builtin in `judge.TRUSTED_NAMES` or `math` (also under the names `import math [as m]`
  and `from math import isclose` bind): evaluated by the judge itself, never the program's own;
- test: bound by a setup statement that uses no candidate name (`x = 5`, `def ref(n): ...`, `import
  fractions`), or any other builtin: evaluated only in a clean interpreter that never ran a program;
- candidate: any other name (the program's), and every name bound by, or passed to, a setup statement
  that uses a candidate name (`s = Stack()` binds candidate `s`; `s.push(xs)` makes `xs` one too, since
  it may have been changed there).
Statements that use a candidate name run in the candidate's interpreter only. The others run in the
clean interpreter, and also in the candidate's when it needs them: imports, statements that only call
imported modules or builtins (`random.seed(0)`), and statements that bind or change names its probes
or statements use (walking backwards). So test data and reference functions it does not receive as
arguments stay out of its sight.

Each assert condition is rewritten into a verdict for the judge (judge.py):
- a maximal sub-expression without candidate names stays for the judge when the judge can evaluate it
  (literals, trusted calls, ...), else becomes a `Resolved` leaf evaluated in the clean interpreter;
- operators, comparisons, not/and/or, conditional expressions, displays, comprehensions, subscripts
  of non-candidate values, and calls of trusted functions or of pure methods of non-candidate values
  are combinators: their operands are rewritten in turn;
- a comprehension over literals whose elements need the candidate is first unrolled into the display
  of its elements, its variables replaced by their values (`all(p(x) for x in [2, 3])` -> `all([p(2),
  p(3)])`);
- every other sub-expression with a candidate name is a `Probe` leaf, evaluated whole in the
  candidate's interpreter, which answers its repr: a call of a candidate function or method with its
  arguments (nested candidate calls are inside the outermost one), a candidate value or its attribute
  or subscript, a trusted higher-order builtin given a candidate function (`map(f, xs)`).
In a truth context (the assert itself, operands of `not`, of and/or and conditional tests in a truth
context) a probed value is wrapped in bool(); a trusted builtin applied to probed values only gets a
`Fallback` (judge.Fallback), so `len(s)`, `list(gen())`, `bool(np_bool)` work on non-literal values.

Guarantee: the candidate is sent only Probe expressions (its own names applied to arguments), the
fallback calls of trusted builtins on its own values, and the setup statements it needs; never the
expected values, the constants and operators of the comparison, negations, tolerances, or test data
and functions it is not given as arguments. It answers one literal per probe, and the verdict is
computed outside from literals.

A test that cannot be judged this way fails for every program (logged once): a probe that needs the
variable of a comprehension over candidate values (`all(f(x) for x in g(3))`) or of a lambda; a test
function applied to candidate values (`check(f(1))`); an assert inside a compound statement.
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import logging
import symtable
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo_fast.rewards.code.judge import (
    HIGHER_ORDER,
    MATH,
    METHOD_NAMES,
    OPAQUE,
    TRUSTED_NAMES,
    Fallback,
    Probe,
    Resolved,
    Unjudgeable,
    comprehension_bindings,
    read_value,
    verdict,
)

log = logging.getLogger(__name__)

BUILTIN_NAMES = frozenset(dir(builtins))
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_COMBINATORS = (
    ast.BoolOp,
    ast.UnaryOp,
    ast.BinOp,
    ast.Compare,
    ast.IfExp,
    ast.Tuple,
    ast.List,
    ast.Set,
    ast.Dict,
    ast.Starred,
    ast.Slice,
    ast.Lambda,
    *_COMPREHENSIONS,
)
_JUDGED = (ast.Constant, ast.Subscript, ast.Call, *_COMBINATORS)
_BINDINGS = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_IMPORTS = (ast.Import, ast.ImportFrom)
_UNROLL_LIMIT = 1000


@dataclass(frozen=True)
class Item:
    """An expression a runner evaluates and answers repr of. With `unless_plain`, a fallback: evaluated
    (with `__v` the values so far) only when one of those items is not a plain literal."""

    expr: str
    unless_plain: tuple[int, ...] | None = None

    def message(self) -> dict[str, Any]:
        if self.unless_plain is None:
            return {"expr": self.expr}
        return {"expr": self.expr, "unless_plain": list(self.unless_plain)}


@dataclass(frozen=True)
class Step:
    """Statements to run, then items to evaluate, in one interpreter."""

    run: str
    items: tuple[Item, ...]

    def message(self) -> dict[str, Any]:
        return {"run": self.run, "items": [item.message() for item in self.items]}


@dataclass(frozen=True, eq=False)
class AssertCase:
    """One assert test, split (see module doc). `problem`: why it cannot be judged (it then fails)."""

    test: str
    candidate: tuple[Step, ...] = ()
    clean: tuple[Step, ...] = ()
    verdicts: tuple[ast.expr, ...] = ()
    problem: str | None = None

    def probe(self) -> dict[str, Any]:
        """The candidate's probe for this test (the launcher adds the token)."""
        return {"steps": [step.message() for step in self.candidate]}

    def clean_probe(self) -> dict[str, Any]:
        """The clean interpreter's probe, in a fresh namespace."""
        return {"steps": [step.message() for step in self.clean], "fresh": True}

    def passes(self, answer: Any, resolved: Sequence[Any]) -> bool:
        """Whether every assert holds, given the candidate's answer to `probe()` and the values read
        from the clean interpreter's answer (OPAQUE where it had none)."""
        values = answer.get("values") if isinstance(answer, dict) else None
        if not isinstance(values, list) or len(values) != sum(len(step.items) for step in self.candidate):
            return False
        probes = [read_value(value) for value in values]
        return all(verdict(condition, probes, resolved) for condition in self.verdicts)


@functools.lru_cache(maxsize=4096)
def parse_assert(test: str) -> AssertCase:
    """Split one assert test (see module doc). Raises ValueError when it is not Python or does not end
    with an assert; a test that cannot be judged is returned with its `problem`."""
    try:
        body = ast.parse(test).body
    except SyntaxError as exc:
        raise ValueError(f"tests: not valid Python: {test!r:.200} ({exc.msg})") from None
    if not body or not isinstance(body[-1], ast.Assert):
        raise ValueError(f"tests: each test must end with an assert statement: {test!r:.200}")
    planner = _Planner()
    try:
        for statement in body:
            planner.add(statement)
    except (Unjudgeable, SyntaxError) as exc:
        log.warning("code_tests: this test fails for every program, it cannot be judged (%s): %.300r", exc, test)
        return AssertCase(test, problem=str(exc))
    return planner.case(test)


def resolved_values(case: AssertCase, answer: Any) -> tuple[Any, ...]:
    """The values read from a clean interpreter's answer to `case.clean_probe()` (OPAQUE when missing)."""
    count = sum(len(step.items) for step in case.clean)
    values = answer.get("values") if isinstance(answer, dict) else None
    if not isinstance(values, list) or len(values) != count:
        return (OPAQUE,) * count
    return tuple(read_value(value) for value in values)


@dataclass
class _Check:
    """One assert while planning: what its verdict asks of each interpreter."""

    probes: list[Item] = field(default_factory=list)
    resolves: list[Item] = field(default_factory=list)
    probe_names: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class _Statement:
    """One setup statement while planning."""

    node: ast.stmt
    candidate: bool  # uses a candidate name: runs in the candidate's interpreter only
    used: set[str]
    binds: set[str]


class _Planner:
    """Walks a test's statements in order (see module doc)."""

    def __init__(self) -> None:
        self.kinds: dict[str, str] = {}  # names the setup bound so far: "trusted" | "test" | "candidate"
        self.aliases: dict[str, ast.expr] = {}  # trusted names bound by math imports -> what the judge reads
        self.events: list[_Statement | _Check] = []
        self.verdicts: list[ast.expr] = []
        self.probe_count = self.resolve_count = 0
        self.check = _Check()

    # ---- names ----

    def kind(self, name: str, scope: frozenset[str] = frozenset()) -> str:
        if name in scope:
            return "local"
        if name in self.kinds:
            return self.kinds[name]
        if name in TRUSTED_NAMES:
            return "trusted"
        return "test" if name in BUILTIN_NAMES else "candidate"

    def kinds_of(self, node: ast.expr, scope: frozenset[str]) -> set[str]:
        return {self.kind(name, scope) for name in free_names(node)}

    def trusted(self, name: str) -> Any:
        """What a trusted name means to the judge."""
        if name in self.aliases:
            alias = self.aliases[name]
            return MATH if isinstance(alias, ast.Name) else MATH.attributes[alias.attr]
        return TRUSTED_NAMES[name]

    # ---- statements ----

    def add(self, statement: ast.stmt) -> None:
        if isinstance(statement, ast.Assert):
            self.verdicts.append(self.assertion(statement))
            return
        if any(isinstance(node, ast.Assert) for node in ast.walk(statement)):
            raise Unjudgeable("an assert inside a compound statement")
        reads, binds = _reads_binds(statement)
        own = {name for name in reads & binds if name not in self.kinds and name not in BUILTIN_NAMES}
        used = reads - own
        candidate = any(self.kind(name) == "candidate" for name in used)
        for name in binds:
            self.kinds[name] = "candidate" if candidate else "test"
            self.aliases.pop(name, None)
        if candidate:
            for name in used:
                if self.kinds.get(name) == "test":
                    self.kinds[name] = "candidate"  # the candidate may have changed it
        else:
            self.bind_math(statement)
        self.events.append(_Statement(statement, candidate, used, binds))

    def bind_math(self, statement: ast.stmt) -> None:
        """`import math [as m]` and `from math import f [as g]` (f trusted) bind trusted names."""
        if isinstance(statement, ast.Import):
            aliases = {a.asname or a.name: ast.Name("math", ast.Load()) for a in statement.names if a.name == "math"}
        elif isinstance(statement, ast.ImportFrom) and statement.module == "math" and not statement.level:
            aliases = {
                a.asname or a.name: ast.Attribute(ast.Name("math", ast.Load()), a.name, ast.Load())
                for a in statement.names
                if a.name in MATH.attributes
            }
        else:
            return
        for name, alias in aliases.items():
            self.kinds[name], self.aliases[name] = "trusted", alias

    # ---- assert conditions ----

    def assertion(self, statement: ast.Assert) -> ast.expr:
        self.check = _Check()
        condition = self.rewrite(statement.test, frozenset(), truth=True)
        self.events.append(self.check)
        return condition

    def rewrite(self, node: ast.expr, scope: frozenset[str], truth: bool = False) -> ast.expr:
        """`node` for the judge (see module doc)."""
        if isinstance(node, ast.Constant):
            return node
        if isinstance(node, ast.Name):
            return self.name(node, scope, truth)
        kinds = self.kinds_of(node, scope)
        if "candidate" not in kinds:
            if "test" not in kinds and self.in_process(node, scope):
                return self.children(node, scope, truth)
            return self.resolve(node, kinds)
        if isinstance(node, _COMPREHENSIONS) and self.over_literals(node, scope):
            return self.rewrite(self.unroll(node), scope, truth)
        if self.combinator(node, scope):
            return self.children(node, scope, truth)
        return self.probe(node, kinds, truth)

    def over_literals(self, node: ast.expr, scope: frozenset[str]) -> bool:
        """Whether the loops of a comprehension (iterables, conditions) are trusted expressions only."""
        loops = ast.ListComp(ast.Constant(None), node.generators)
        return self.kinds_of(loops, scope) <= {"trusted"} and self.in_process(loops, scope)

    def unroll(self, node: ast.expr) -> ast.expr:
        """A comprehension over literals as the display of its elements, its variables replaced by their
        values: `all(is_prime(p) for p in [2, 3])` -> `all([is_prime(2), is_prime(3)])`, so that the
        candidate is asked for calls with literal arguments (a generator becomes a list: every element
        is evaluated, also after the first that decides any() or all())."""
        bindings = comprehension_bindings(node.generators, _UNROLL_LIMIT)
        if isinstance(node, ast.DictComp):
            keys = [_substitute(node.key, binding) for binding in bindings]
            return ast.Dict(keys, [_substitute(node.value, binding) for binding in bindings])
        elements = [_substitute(node.elt, binding) for binding in bindings]
        if not isinstance(node, ast.SetComp):
            return ast.List(elements, ast.Load())
        return ast.Set(elements) if elements else ast.Call(ast.Name("set", ast.Load()), [], [])

    def name(self, node: ast.Name, scope: frozenset[str], truth: bool) -> ast.expr:
        kind = self.kind(node.id, scope)
        if kind == "trusted":
            return copy.deepcopy(self.aliases.get(node.id, node))
        if kind == "local":
            return node
        if kind == "test":
            return self.resolve(node, {kind})
        return self.probe(node, {kind}, truth)

    def resolve(self, node: ast.expr, kinds: set[str]) -> ast.expr:
        if "local" in kinds:
            raise Unjudgeable(f"`{ast.unparse(node):.100}` needs the test's own names and a comprehension variable")
        self.check.resolves.append(Item(ast.unparse(node)))
        self.resolve_count += 1
        return Resolved(self.resolve_count - 1)

    def probe(self, node: ast.expr, kinds: set[str], truth: bool) -> ast.expr:
        if "local" in kinds:
            raise Unjudgeable(f"`{ast.unparse(node):.100}` calls the program with a comprehension or lambda variable")
        if isinstance(node, ast.Call) and any(self.kinds.get(name) == "test" for name in free_names(node.func)):
            raise Unjudgeable(f"`{ast.unparse(node):.100}` applies a function of the test to the program's values")
        self.check.probe_names |= free_names(node)
        leaf = Probe(self.item(Item(ast.unparse(node))))
        return self.fallback(ast.Call(ast.Name("bool", ast.Load()), [leaf], [])) if truth else leaf

    def item(self, item: Item) -> int:
        self.check.probes.append(item)
        self.probe_count += 1
        return self.probe_count - 1

    def fallback(self, call: ast.Call) -> ast.expr:
        """A trusted call of probed values only, with the candidate's answer as fallback (judge.Fallback)."""
        probes_only = call.args and all(isinstance(arg, Probe) for arg in call.args)
        if call.keywords or not probes_only or self.judge_callee(call.func) is None:
            return call
        values = ", ".join(f"__v[{arg.index}]" for arg in call.args)
        index = self.item(Item(f"{ast.unparse(call.func)}({values})", tuple(arg.index for arg in call.args)))
        return Fallback(call, index)

    def judge_callee(self, func: ast.expr) -> Any:
        """The trusted function a canonical callee (`len`, `math.floor`) names, else None."""
        if isinstance(func, ast.Name):
            return TRUSTED_NAMES.get(func.id)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "math":
            return MATH.attributes.get(func.attr)
        return None

    def children(self, node: ast.expr, scope: frozenset[str], truth: bool) -> ast.expr:
        """A copy of `node` with its operands rewritten."""
        new = copy.deepcopy(node)
        if isinstance(new, ast.Call):
            new.func = self.callee(new.func, scope)
        for holder, key, inner, inner_truth in _slots(new, scope, truth):
            _put(holder, key, self.rewrite(_get(holder, key), inner, inner_truth))
        return self.fallback(new) if isinstance(new, ast.Call) else new

    def callee(self, func: ast.expr, scope: frozenset[str]) -> ast.expr:
        if isinstance(func, ast.Name):
            return self.name(func, scope, False)
        if isinstance(func, ast.Attribute) and self.math_attribute(func, scope):
            return ast.Attribute(self.name(func.value, scope, False), func.attr, ast.Load())
        if isinstance(func, ast.Attribute):
            return ast.Attribute(self.rewrite(func.value, scope), func.attr, ast.Load())
        return self.rewrite(func, scope)

    def combinator(self, node: ast.expr, scope: frozenset[str]) -> bool:
        """Whether `node` (with candidate names) is judged by the judge from its rewritten operands."""
        if isinstance(node, _COMBINATORS):
            return True
        if isinstance(node, ast.Subscript):
            return "candidate" not in self.kinds_of(node.value, scope)
        if isinstance(node, ast.Call):
            return self.trusted_callee(node.func, scope) and not self.given_candidate_function(node, scope)
        return False

    def trusted_callee(self, func: ast.expr, scope: frozenset[str]) -> bool:
        """A trusted function, or a pure method of a non-candidate value."""
        if isinstance(func, ast.Name):
            return self.kind(func.id, scope) == "trusted" and callable(self.trusted(func.id))
        if isinstance(func, ast.Attribute) and self.math_attribute(func, scope):
            return callable(MATH.attributes[func.attr])
        if isinstance(func, ast.Attribute):
            return func.attr in METHOD_NAMES and "candidate" not in self.kinds_of(func.value, scope)
        return False

    def math_attribute(self, node: ast.Attribute, scope: frozenset[str]) -> bool:
        value = node.value
        return (
            isinstance(value, ast.Name)
            and self.kind(value.id, scope) == "trusted"
            and self.trusted(value.id) is MATH
            and node.attr in MATH.attributes
        )

    def given_candidate_function(self, node: ast.Call, scope: frozenset[str]) -> bool:
        """A trusted higher-order builtin handed a candidate function (`map(f, xs)`, `sorted(xs, key=f)`)."""
        if not isinstance(node.func, ast.Name) or node.func.id not in HIGHER_ORDER:
            return False
        where = HIGHER_ORDER[node.func.id]
        if isinstance(where, int):
            given = node.args[where : where + 1]
        else:
            given = [k.value for k in node.keywords if k.arg in (where, None)]
        return any("candidate" in self.kinds_of(arg, scope) for arg in given)

    def in_process(self, node: ast.expr, scope: frozenset[str]) -> bool:
        """Whether the judge can evaluate `node` (no candidate or test names) itself."""
        if isinstance(node, ast.Name):
            return self.kind(node.id, scope) in ("trusted", "local")
        if isinstance(node, ast.Attribute):
            return self.math_attribute(node, scope)
        if not isinstance(node, _JUDGED) or not _judged_shape(node):
            return False
        if isinstance(node, ast.Call) and not self.in_process_callee(node.func, scope):
            return False
        return all(self.in_process(_get(h, k), inner) for h, k, inner, _ in _slots(node, scope, False))

    def in_process_callee(self, func: ast.expr, scope: frozenset[str]) -> bool:
        if isinstance(func, ast.Attribute) and not self.math_attribute(func, scope):
            return func.attr in METHOD_NAMES and self.in_process(func.value, scope)
        if isinstance(func, ast.Lambda):
            return self.in_process(func, scope)
        return self.trusted_callee(func, scope)

    # ---- the result ----

    def case(self, test: str) -> AssertCase:
        sent = self.sent_to_candidate()
        candidate_steps, clean_steps, candidate_run, clean_run = [], [], [], []
        for event in self.events:
            if isinstance(event, _Check):
                candidate_steps.append(Step("\n".join(candidate_run), tuple(event.probes)))
                clean_steps.append(Step("\n".join(clean_run), tuple(event.resolves)))
                candidate_run, clean_run = [], []
                continue
            if id(event) in sent:
                candidate_run.append(ast.unparse(event.node))
            if not event.candidate:
                clean_run.append(ast.unparse(event.node))
        needs_clean = any(step.items for step in clean_steps)
        return AssertCase(test, tuple(candidate_steps), tuple(clean_steps) if needs_clean else (), tuple(self.verdicts))

    def sent_to_candidate(self) -> set[int]:
        """ids of the statements the candidate runs: those using candidate names, imports, and test
        statements that bind or change names it needs (walking backwards from its probes)."""
        statements = [event for event in self.events if isinstance(event, _Statement)]
        imported = {name for s in statements if isinstance(s.node, _IMPORTS) for name in s.binds}
        needed: set[str] = set()
        sent: set[int] = set()
        for event in reversed(self.events):
            if isinstance(event, _Check):
                needed |= event.probe_names
                continue
            binding = isinstance(event.node, _BINDINGS) and bool(event.binds)
            environment = not binding and event.used <= imported | BUILTIN_NAMES  # random.seed(0), ...
            touches = (event.binds if binding else event.used) & needed
            if event.candidate or isinstance(event.node, _IMPORTS) or environment or touches:
                sent.add(id(event))
                needed = (needed - event.binds if binding else needed) | event.used
        return sent


def free_names(node: ast.expr) -> set[str]:
    """Names `node` reads that it does not bind itself (comprehension targets, lambda parameters)."""
    return _free(node, frozenset())


def _free(node: ast.expr, scope: frozenset[str]) -> set[str]:
    if isinstance(node, ast.Name):
        return set() if node.id in scope else {node.id}
    names = _free(node.func, scope) if isinstance(node, ast.Call) else set()
    for holder, key, inner, _ in _slots(node, scope, False):
        names |= _free(_get(holder, key), inner)
    return names


def _substitute(node: ast.expr, values: dict[str, Any], scope: frozenset[str] = frozenset()) -> ast.expr:
    """`node` with its free names in `values` replaced by literals of their values."""
    if isinstance(node, ast.Name):
        return _literal_node(values[node.id]) if node.id in values and node.id not in scope else node
    new = copy.deepcopy(node)
    if isinstance(new, ast.Call):
        new.func = _substitute(new.func, values, scope)
    for holder, key, inner, _ in _slots(new, scope, False):
        _put(holder, key, _substitute(_get(holder, key), values, inner))
    return new


def _literal_node(value: Any) -> ast.expr:
    """A Python literal of `value` (a comprehension variable over the test's literals)."""
    try:
        node = ast.parse(repr(value), mode="eval").body
        same = ast.literal_eval(node) == value and type(ast.literal_eval(node)) is type(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        same = False
    if not same:
        raise Unjudgeable(f"a comprehension variable is not a plain literal: {value!r:.100}")
    return node


def _slots(node: ast.expr, scope: frozenset[str], truth: bool) -> Iterator[tuple[Any, Any, frozenset[str], bool]]:
    """The operands of `node` as (holder, key, scope, truth): `holder[key]` (a list) or
    `getattr(holder, key)` is the operand, evaluated with `scope` as local names, in a truth context
    when `truth`. A call's function is not among them."""
    if isinstance(node, _COMPREHENSIONS):
        for generator in node.generators:
            yield generator, "iter", scope, False
            scope = scope | _target_names(generator.target)
            yield from ((generator.ifs, i, scope, True) for i in range(len(generator.ifs)))
        yield from ((node, part, scope, False) for part in ("elt", "key", "value") if hasattr(node, part))
        return
    if isinstance(node, ast.Lambda):
        params = node.args
        names = {a.arg for a in params.posonlyargs + params.args + params.kwonlyargs}
        names |= {a.arg for a in (params.vararg, params.kwarg) if a is not None}
        yield from ((params.defaults, i, scope, False) for i in range(len(params.defaults)))
        yield node, "body", scope | names, False
        return
    for name, value in ast.iter_fields(node):
        if name == "func" and isinstance(node, ast.Call):
            continue
        inner_truth = _truth_operand(node, name, truth)
        if isinstance(value, ast.expr):
            yield node, name, scope, inner_truth
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, ast.expr):
                    yield value, i, scope, inner_truth
                elif isinstance(item, ast.keyword):
                    yield item, "value", scope, False


def _truth_operand(node: ast.expr, field: str, truth: bool) -> bool:
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, ast.Not)
    if isinstance(node, ast.BoolOp):
        return truth
    if isinstance(node, ast.IfExp):
        return field == "test" or truth
    return False


def _judged_shape(node: ast.expr) -> bool:
    """Shapes the judge declines although it knows the node type."""
    if isinstance(node, ast.BinOp):
        return not isinstance(node.op, ast.MatMult)
    if isinstance(node, _COMPREHENSIONS):
        return all(not g.is_async and _simple_target(g.target) for g in node.generators)
    if isinstance(node, ast.Lambda):
        params = node.args
        return not (params.posonlyargs or params.vararg or params.kwonlyargs or params.kwarg or params.defaults)
    return True


def _simple_target(target: ast.expr) -> bool:
    if isinstance(target, ast.Name):
        return True
    return isinstance(target, (ast.Tuple, ast.List)) and all(_simple_target(t) for t in target.elts)


def _target_names(target: ast.expr) -> frozenset[str]:
    return frozenset(node.id for node in ast.walk(target) if isinstance(node, ast.Name))


def _get(holder: Any, key: Any) -> Any:
    return holder[key] if isinstance(holder, list) else getattr(holder, key)


def _put(holder: Any, key: Any, value: Any) -> None:
    if isinstance(holder, list):
        holder[key] = value
    else:
        setattr(holder, key, value)


def _reads_binds(statement: ast.stmt) -> tuple[set[str], set[str]]:
    """Module-level names a setup statement reads (also from the functions and classes it defines) and
    binds."""
    table = symtable.symtable(ast.unparse(statement), "<test>", "exec")
    reads, binds = set(), set()
    for symbol in table.get_symbols():
        if symbol.is_referenced():
            reads.add(symbol.get_name())
        if symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace():
            binds.add(symbol.get_name())
    nested = list(table.get_children())
    while nested:
        scope = nested.pop()
        nested.extend(scope.get_children())
        for symbol in scope.get_symbols():
            if symbol.is_global() and symbol.is_referenced():
                reads.add(symbol.get_name())
            if symbol.is_declared_global() and symbol.is_assigned():
                binds.add(symbol.get_name())
    return reads, binds

"""How assert tests are split (plan.py) and judged (judge.py): what the candidate is sent, and that the
in-process judge only reads literals and stays within its budget."""

from __future__ import annotations

import ast
import json
import time

import pytest
from test_rewards_code import score

from grpo_fast.rewards.code.judge import OPAQUE, Probe, read_value, verdict
from grpo_fast.rewards.code.plan import parse_assert

# test -> strings that must not appear in what the candidate's interpreter is sent (it may be sent the names
# of trusted builtins applied to its own values, as fallbacks: `sorted(__v[0])`)
HIDDEN = {
    "assert f(1) == 123457": ["123457"],
    "assert not is_prime(8)": ["not"],
    "assert abs(area(2) - 12.566) < 1e-3": ["12.566", "0.001", "abs", "<"],
    "import math\nassert math.isclose(v(10), 4188.79, rel_tol=0.001)": ["4188.79", "isclose", "rel_tol"],
    "def ref(x):\n    return x * 31337\nassert f(3) == ref(3)": ["31337", "ref"],
    "expected = [9, 8, 7]\nassert f(3) == expected": ["9, 8, 7", "expected"],
    "x = 5\nassert f(x) == x * 77": ["77", "=="],
    "assert 0 < f(1) < 424242": ["424242", "<"],
    "assert f(1) in [5551, 5552]": ["5551", "5552", " in "],
    "assert sorted(f(1)) == [7771]": ["7771"],
    "assert all(is_prime(p) for p in [2, 3])": ["all", " for "],
    "s = Stack()\ns.push(1)\nassert s.pop() == 90210": ["90210"],
    "assert len(s) == 60606 and s": ["60606", " and "],
    "xs = [3, 1, 2]\nexpected = sorted(xs)\nsort_in_place(xs)\nassert xs == expected": ["expected", "sorted"],
}


@pytest.mark.parametrize("test", sorted(HIDDEN))
def test_the_candidate_is_never_sent_expected_values_or_the_verdict(test):
    case = parse_assert(test)
    assert case.problem is None
    sent = json.dumps(case.probe())
    assert [hidden for hidden in HIDDEN[test] if hidden in sent] == []


def test_what_the_candidate_is_sent():
    def sent(test):
        return [(step.run, [item.expr for item in step.items]) for step in parse_assert(test).candidate]

    assert sent("x = 5\nassert f(x) == x * 77") == [("x = 5", ["f(x)"])]
    assert sent("s = Stack()\ns.push(1)\nassert s.pop() == 1\nassert s.pop() is None") == [
        ("s = Stack()\ns.push(1)", ["s.pop()"]),
        ("", ["s.pop()"]),
    ]
    assert sent("assert f(g(3)) == 1") == [("", ["f(g(3))"])]  # the outermost candidate call, whole
    assert sent("assert f(3) == g(3)") == [("", ["f(3)", "g(3)"])]
    assert sent("assert 1 < f(3) <= f(4)") == [("", ["f(3)", "f(4)"])]
    assert sent("assert list(map(f, [1, 2])) == [2, 3]") == [("", ["map(f, [1, 2])", "list(__v[0])"])]
    assert sent("import random\nrandom.seed(0)\nassert f(1) == 3") == [("import random\nrandom.seed(0)", ["f(1)"])]
    assert sent("assert [f(i) for i in range(3)] == [0, 1, 4]") == [("", ["f(0)", "f(1)", "f(2)"])]


@pytest.mark.parametrize(
    "test",
    [
        "assert all(f(x) for x in g(3))",  # a candidate call on a variable of a candidate list
        "def check(r):\n    return r == 42\nassert check(f(1))",  # the test's function on a candidate value
        "for x in [1, 2]:\n    assert f(x)\nassert f(0)",  # an assert the candidate would run
    ],
)
def test_tests_that_cannot_be_judged_fail_for_every_program(test):
    assert parse_assert(test).problem
    assert score("def f(x):\n    return 42\ndef g(x):\n    return [1]\n", [test, "assert f(0) == 42"]) == 0.5


def test_truth_tests_on_values_that_are_not_literals_use_their_own_methods():
    program = """
class Stack:
    def __init__(self): self.items = []
    def push(self, x): self.items.append(x)
    def __len__(self): return len(self.items)
    def __bool__(self): return bool(self.items)
def squares(n):
    return (i * i for i in range(n))
class Verdict:
    def __bool__(self): return False
def falsy():
    return Verdict()
"""
    tests = [
        "s = Stack()\ns.push(1)\nassert len(s) == 1 and s",
        "assert list(squares(3)) == [0, 1, 4]",
        "assert not falsy()",
        "assert squares(2) == [0, 1]",  # a generator is not a literal: fails
        "s = Stack()\nassert isinstance(s, Stack) and not s",
    ]
    assert score(program, tests) == pytest.approx(4 / 5)


def test_read_value_reads_literals_only():
    assert read_value("[1, (2.5, 'a'), {3: None}, {4}, b'x', -1j]") == [1, (2.5, "a"), {3: None}, {4}, b"x", -1j]
    assert read_value("frozenset({1})") == frozenset({1})
    assert read_value("Counter({'a': 2})") == {"a": 2}
    assert read_value("inf") == float("inf")
    for text in ["f()", "x", "().__class__", "__import__('os')", "1 + 1", "[" * 500, "0x" + "f" * 20000, None, 3]:
        assert read_value(text) is OPAQUE


def _probe_verdict(expression: str, *values):
    tree = ast.parse(expression, mode="eval").body

    class Leaves(ast.NodeTransformer):
        def visit_Name(self, node):
            return Probe(int(node.id[1:])) if node.id.startswith("p") and node.id[1:].isdigit() else node

    return verdict(Leaves().visit(tree), list(values), [])


@pytest.mark.parametrize(
    ("expression", "values"),
    [
        ("p0 ** p1 > 0", (7, 10**9)),
        ("pow(p0, p1, p0 + 1) >= 0", (2**5000 + 1, 2**5000)),
        ("p0 << p1 > 0", (1, 10**12)),
        ("len(p0 * p1) > 0", ("ab", 10**12)),
        ("len(list(range(p0))) > 0", (10**12,)),
        ("sum(p0, []) == []", ([[1]] * 100_000,)),
        ("len('%*d' % (p0, 1)) > 0", (10**9,)),
        ("round(p0, p1) == 0", (10**20, -(10**9))),
        ("len([x in p0 for x in p0]) > 0", (list(range(100_000)),)),
        ("len([1 for x in p0 for y in p0]) > 0", (list(range(10_000)),)),
        ("len(p1.join(p0)) > 0", (["a"] * 100_000, "b" * 100_000)),
    ],
)
def test_the_judge_declines_work_that_would_not_end_soon(expression, values):
    start = time.monotonic()
    assert _probe_verdict(expression, *values) is False
    assert time.monotonic() - start < 2.0


def test_the_judge_evaluates_python_semantics():
    assert _probe_verdict("0 < p0 < 10 and not p1 and p2 is None", 5, [], None)
    assert not _probe_verdict("0 < p0 < 10", 10)
    assert _probe_verdict("p0 or 1 / 0", 1)  # short-circuit
    assert not _probe_verdict("p0[5] == 1", [1])  # an assert that raises fails
    assert _probe_verdict("sorted(p0, key=lambda t: -t[1])[0] == ('b', 2)", [("a", 1), ("b", 2)])
    assert _probe_verdict("{k: v for k, v in p0} == {'a': 1} and 'A'.lower() in p1.split(',')", [("a", 1)], "a,b")
    assert _probe_verdict("math.isclose(abs(p0 - 12.566), 0, abs_tol=1e-3)", 12.5664)
    assert not _probe_verdict("p0 == 3", OPAQUE)

"""The judge (judge_runner.py) and the wire (wire.py): what the program is sent, how answers are read, and
that a test runs with Python's semantics on plain data only.

Some tests here play the program's side themselves: they run a real judge in its sandbox and answer its
requests by hand, so that they see exactly what a program would be sent.
"""

from __future__ import annotations

import json
import sys
import time
from fractions import Fraction

import pytest
from test_rewards_code import LIMITS, UNSANDBOXED, score

from grpo_fast.rewards import code_tests
from grpo_fast.rewards.code import programs
from grpo_fast.rewards.code.cases import parse_assert
from grpo_fast.rewards.code.wire import MAX_DEPTH, WireError, decode, dumps, encode, loads
from grpo_fast.sandbox import isolation

LEVEL = isolation()


def _answer(request):
    """A program that answers anything: a new object for calls and attributes, 1 for len, ..."""
    if request["op"] in ("call", "getattr"):
        return {"value": {"h": 7}}
    if request["op"] == "apply":
        return {"value": {"len": 1, "bool": True, "str": "s", "repr": "s", "list": []}.get(request["fn"], True)}
    return {"value": 0}


def converse(test: str, answer=_answer):
    """Run `test` in a judge, answering its requests with `answer`: (the requests, its last message)."""
    judge = programs.judge(LEVEL, LIMITS, sys.executable)
    sent = []
    try:
        message, why = judge.ask(parse_assert(test).message(cpu_s=2.0), 5.0)
        while message is not None and "call" in message:
            sent.append(message["call"])
            message, why = judge.ask({"reply": dumps(answer(message["call"]))}, 5.0)
        assert message is not None, why
        return sent, message
    finally:
        programs.release(judge)


# test -> strings that must not appear in anything the program is sent
HIDDEN = {
    "assert f(1) == 123457": ["123457"],
    "assert not is_prime(8)": ["not"],
    "assert abs(area(2) - 12.566) < 1e-3": ["12.566", "0.001", "abs", "<"],
    "import math\nassert math.isclose(v(10), 4188.79, rel_tol=0.001)": ["4188.79", "isclose", "rel_tol"],
    "def ref(x):\n    return x * 31337\nassert f(3) == ref(3)": ["31337", "ref"],
    "expected = [9, 8, 7]\nassert f(3) == expected": ["9, 8, 7", "expected"],
    "x = 5\nassert f(x) == x * 77": ["77", "=="],
    "x, y = 5, 424242\nassert f(x) == y": ["424242"],
    "cases = [(1, 5551), (2, 5552)]\nfor a, b in cases:\n    assert f(a) == b": ["5551", "5552"],
    "assert sorted(f(1)) == [7771]": ["7771"],
    "s = Stack()\ns.push(1)\nassert s.pop() == 90210": ["90210"],
    "assert len(s) == 60606 and s": ["60606", " and "],
    "xs = [3, 1, 2]\nexpected = sorted(xs)\nsort_in_place(xs)\nassert xs == expected": ["expected", "sorted"],
    "assert count('aab') == Counter({'a': 2, 'b': 1})": ["Counter", '"a",2'],
    "print(31337)\nassert f(1) == 31337": ["31337"],
}


@pytest.mark.parametrize("test", sorted(HIDDEN))
def test_the_program_is_sent_names_and_arguments_only(test):
    sent, _ = converse(test)
    assert sent, "the program was asked nothing"
    text = json.dumps(sent)
    assert [hidden for hidden in HIDDEN[test] if hidden in text] == []
    for request in sent:
        assert set(request) <= {"op", "target", "args", "kwargs", "name", "fn", "arg", "key", "value"}


def test_what_the_program_is_sent():
    assert converse("x = 5\nassert f(x, y=[1, (2,)]) == 3")[0] == [
        {"op": "call", "target": {"n": "f"}, "args": [5], "kwargs": [["y", [1, {"t": [2]}]]]},
        {"op": "value", "target": {"h": 7}},  # f answered an object: `==` asks for its plain value
    ]
    sent, done = converse("s = Stack()\ns.push(1)\nassert s.pop() == 0")
    assert [r["op"] for r in sent] == ["call", "getattr", "call", "getattr", "call", "value"]
    assert [r.get("name") for r in sent if r["op"] == "getattr"] == ["push", "pop"]
    assert sent[2]["target"] == {"h": 7} and sent[2]["args"] == [1]
    assert done == {"done": True, "why": ""}  # s.pop() answered an object whose plain value is 0


def test_attributes_of_builtin_values_are_taken_from_the_plain_value():
    """`keys`, `endswith`, `real` are read from the value the program's object has as plain data; only
    what changes the object (`append`, `pop`) and attributes builtin values lack go to the program."""

    def answer(request):
        if request["op"] == "value":
            return {"value": {"d": [["a", 1]]}}
        return _answer(request)

    sent, done = converse("d = f()\nassert list(d.keys()) == ['a'] and d.get('b', 2) == 2", answer)
    assert [r["op"] for r in sent] == ["call", "value", "value"] and done["done"] is True
    sent, _ = converse("d = f()\nd.pop('a')\nd.custom()\nassert d", answer)
    assert [r.get("name") for r in sent if r["op"] == "getattr"] == ["pop", "custom"]

    def opaque(request):
        return {"opaque": True} if request["op"] == "value" else _answer(request)

    sent, done = converse("assert f().endswith('x')", opaque)  # a predicate needs a plain value
    assert [r["op"] for r in sent] == ["call", "value"] and done["done"] is False


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ("[" * 5000 + "]" * 5000, "not plain data"),
        ('{"value": ' + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "}", "deeper"),
        ('{"value": {"x": 1}}', "malformed"),
        ('{"value": 1', "malformed message"),
        ('{"value": {"F": [1, 0]}}', "malformed"),
        ('{"value": {"s": [[1]]}}', "malformed"),
        ('{"value": 1' + "0" * 5000 + "}", "malformed message"),
        ('{"nothing": 1}', "did not answer"),
        ("\udcff", "malformed message"),
    ],
)
def test_an_answer_that_is_not_plain_data_fails_the_test_whatever_it_catches(reply, why):
    test = "try:\n    v = f(1)\nexcept BaseException:\n    v = 1\nassert v == 1"
    judge = programs.judge(LEVEL, LIMITS, sys.executable)
    try:
        message, _ = judge.ask(parse_assert(test).message(cpu_s=2.0), 5.0)
        message, _ = judge.ask({"reply": reply}, 5.0)
        assert message["done"] is False and why in message["why"]
    finally:
        programs.release(judge)


def test_exceptions_the_program_raises_keep_their_builtin_type_but_never_end_an_iteration():
    def raising(name):
        return lambda request: {"raised": [name, "boom", [name, "Exception", "BaseException"]]}

    catches = "try:\n    f(1)\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError"
    assert converse(catches, raising("ValueError"))[1]["done"] is True
    assert converse(catches, raising("KeyError"))[1]["done"] is False
    assert converse("assert all(map(f, [1, 2]))", raising("StopIteration"))[1]["done"] is False
    assert converse("assert not any(f(x) for x in [1, 2])", raising("StopIteration"))[1]["done"] is False
    custom = "try:\n    f(1)\nexcept ValueError as e:\n    assert type(e) is ValueError and str(e) == 'boom'"
    subclass = lambda request: {"raised": ["MyError", "boom", ["MyError", "ValueError", "Exception"]]}  # noqa: E731
    assert converse(custom, subclass)[1]["done"] is True
    unknown = "try:\n    f(1)\nexcept Exception as e:\n    assert type(e).__name__ == 'ProgramError'"
    assert converse(unknown, lambda request: {"raised": ["Odd", "", ["Odd"]]})[1]["done"] is True


def test_tests_the_old_split_could_not_judge_are_judged():
    program = (
        "def f(x):\n    return 42\ndef g(x):\n    return [1, 2]\nclass Box:\n    def __init__(self): self.v = []\n"
    )
    program += "class Counter:\n    n = 0\n    def add(self, k): self.n += k\n    def total(self): return self.n\n"
    tests = [
        "assert all(f(x) == 42 for x in g(3))",  # a call on a variable of a loop over program values
        "def check(r):\n    return r == 42\nassert check(f(1))",  # the test's function on a program value
        "for x in [1, 2]:\n    assert f(x) == 42",  # asserts in a loop
        "b = Box()\nb.v.append(3)\nassert b.v == [3] or b.v == []",  # an attribute that is plain data
        "xs = [3, 1, 2]\nsorted_in_place = sorted(xs)\nassert g(xs) == [1, 2]",
        "from solution import Counter\nc = Counter()\nc.add(2)\nassert c.total() == 2",  # a KNOWN name, imported
    ]
    assert score(program, tests) == 1.0


def test_in_place_changes_of_arguments_reach_the_test():
    program = "def sort_in_place(xs):\n    xs.sort()\ndef fill(d, s):\n    d['k'] = 1\n    s.add(2)\n"
    tests = [
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
        "d, s = {}, set()\nfill(d, s=s)\nassert d == {'k': 1} and s == {2}",
    ]
    assert score(program, tests) == 1.0


def test_truth_tests_on_values_that_are_not_data_use_their_own_methods():
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
        "assert squares(2) == [0, 1]",  # a generator has no plain value: fails
        "s = Stack()\nassert isinstance(s, Stack) and not s",
    ]
    assert score(program, tests) == pytest.approx(4 / 5)


def test_a_test_that_runs_too_long_on_program_data_fails_and_the_next_is_judged():
    program = "def f(x):\n    return list(range(10 ** 4))\n"
    tests = [
        "assert sum(x ** 40 for x in f(1) for _ in range(10 ** 4)) > 0",  # stopped by the judge's CPU limit
        # stopped by the wall clock: it catches the CPU limit's interruption
        "while True:\n    try:\n        sum(f(1))\n    except BaseException:\n        pass\nassert False",
        "assert len(f(1)) == 10 ** 4",
    ]
    start = time.monotonic()
    limits = {"wall_s": 1.0, "memory_bytes": 1 << 30}
    assert code_tests(["p"], [program], [tests], limits=limits, allow_unsandboxed=UNSANDBOXED) == [pytest.approx(1 / 3)]
    assert time.monotonic() - start < 15


def test_unjudgeable_tests_fail_for_every_program():
    program = "def f(x):\n    return x\ndef apply(g, x):\n    return g(x)\n"
    tests = [
        "assert eval(repr(f(1))) == 1",  # program output would run as code in the judge
        "assert apply(lambda x: x, 1) == 1",  # a function of the test cannot be sent to the program
        "assert f(1) == 1",
    ]
    assert score(program, tests) == pytest.approx(1 / 3)


def test_wire_round_trip_and_limits():
    values = [
        None, True, 3, -2.5, float("inf"), "é", b"\x00", bytearray(b"x"), 1 + 2j, [1, [2]], (1, (2,)), {1, 2},
        frozenset({3}), {(1, 2): {"a": [None]}}, range(1, 9, 2), Fraction(1, 3),
    ]  # fmt: skip
    for value in values:
        back = decode(loads(dumps(encode(value))))
        assert back == value and type(back) is type(value)
    nan = decode(loads(dumps(encode(float("nan")))))
    assert nan != nan
    deep = []
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    for bad in (deep, object(), lambda: 1):
        with pytest.raises(WireError):
            encode(bad)
    cyclic = []
    cyclic.append(cyclic)
    with pytest.raises(WireError):
        encode(cyclic)
    for text in ('{"h": 1}', '{"t": [1], "s": [2]}', '{"b": "zz"}', '{"c": [1]}', "[" * 3000 + "]" * 3000):
        with pytest.raises(WireError):
            decode(loads(text))

"""Attacks that earned a wrong program more than its honest score, by class, each paired with the honest
program that shows the tests are judgeable:

1. expected values reach the program: the test's setup binds them next to the inputs it needs;
2. program objects decide the verdict: a method of a returned value, a name the test does not import,
   a comparison in a setup statement;
3. failure pays: an answer that breaks the caller, a program that outlasts the reward pool's timeout, a
   program that is not valid text (a lone surrogate);
4. the program chooses both sides: a test that compares only program values (`f(x) == g(x)`).

Every wrong program here returns nothing right by itself: whatever it earns, it stole or forged.
"""

from __future__ import annotations

import functools
import time

import pytest
from test_rewards_code import UNSANDBOXED, sandbox_processes, score

from grpo_fast.rewards import RewardPool, code_tests
from grpo_fast.rewards.code.cases import parse_assert

# ---- 1. expected values reach the program ----

THIEF = """
import io, sys
_seen = io.StringIO()
sys.stdout = _seen
def _steal(x):
    g = globals()
    if "expected" in g:
        return g["expected"]
    for rows in (g.get("cases"), g.get("tests")):
        for row in rows or ():
            if isinstance(row, tuple) and row[0] == x:
                return row[1]
            if isinstance(row, dict) and row.get("input") == x:
                return row.get("expected")
    for line in _seen.getvalue().splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == str(x):
            return int(words[1])
    return None
def square(x):
    return _steal(x)
def my_sort(xs):
    return _steal(xs)
"""
HONEST = "def square(x):\n    return x * x\ndef my_sort(xs):\n    return sorted(xs)\n"
LEAKY_SETUPS = {
    "tuple_assignment": ["x, expected = 5, 25\nassert square(x) == expected"],
    "list_of_tuples": ["cases = [(2, 4), (3, 9)]\nassert square(cases[0][0]) == cases[0][1]"],
    "list_of_dicts": [
        'tests = [{"input": 3, "expected": 9}]\nassert square(tests[0]["input"]) == tests[0]["expected"]'
    ],
    "input_computed_from_expected": [
        "expected = [1, 2, 3, 4]\nxs = list(reversed(expected))\nassert my_sort(xs) == expected"
    ],
    "print_in_setup": ["x = 6\nexpected = x * x\nprint(x, expected)\nassert square(x) == expected"],
}


@pytest.mark.parametrize("layout", sorted(LEAKY_SETUPS))
def test_the_program_never_sees_expected_values(layout):
    tests = LEAKY_SETUPS[layout]
    assert score(THIEF, tests) == 0.0
    assert score(HONEST, tests) == 1.0


# ---- 2. program objects decide the verdict ----

OBJECT_ATTACKS = {
    "methods_of_a_returned_value": (
        "class _Yes(str):\n"
        "    def endswith(self, *a): return True\n"
        "    startswith = isupper = isdigit = endswith\n"
        "class _Sub(frozenset):\n"
        "    def issubset(self, other): return True\n"
        "def greet(name): return _Yes('nope')\n"
        "def shout(word): return _Yes('nope')\n"
        "def digits(n): return _Yes('nope')\n"
        "def small(n): return _Sub({99})\n",
        "def greet(name): return 'Hello ' + name + '!'\n"
        "def shout(word): return word.upper()\n"
        "def digits(n): return str(n)\n"
        "def small(n): return set(range(n))\n",
        [
            "assert greet('bob').endswith('bob!')",
            "assert greet('amy').startswith('Hello')",
            "assert shout('hi').isupper()",
            "assert digits(42).isdigit()",
            "assert small(3).issubset({0, 1, 2})",
        ],
    ),
    "names_the_test_does_not_import": (
        "def Counter(d=None): return 0\ndef count(s): return 0\n"
        "class np:\n    isclose = staticmethod(lambda *a, **k: True)\ndef area(r): return 0\n",
        "def count(s):\n    out = {}\n    for c in s:\n        out[c] = out.get(c, 0) + 1\n    return out\n"
        "def area(r): return 3.14159265 * r * r\n",
        ["assert count('aab') == Counter({'a': 2, 'b': 1})", "assert np.isclose(area(1), 3.14159)"],
    ),
    "membership_in_a_returned_value": (
        "class _Everything:\n    def __contains__(self, item): return True\n"
        "class _AllList(list):\n    def __contains__(self, item): return True\n"
        "def divisors(n): return _Everything()\n"
        "def squares(n): return _Everything()\n"
        "def letters(s): return _AllList()\n",
        "def divisors(n): return [d for d in range(1, n + 1) if n % d == 0]\n"
        "def letters(s): return sorted(set(s))\n"
        "def squares(n): return (i * i for i in range(n))\n",
        [
            "assert 3 in divisors(12)",
            "assert all(d in divisors(30) for d in (2, 3, 5))",
            "assert 'e' in letters('hello')",
            "assert 9 in squares(5)",
        ],
    ),
    "comparisons_in_setup_statements": (
        "class _Yes:\n    def __eq__(self, other): return True\n    __hash__ = None\ndef f(x): return _Yes()\n",
        "def f(x): return x * x\n",
        ["ok = f(3) == 9\nassert ok", "result = f(4)\ncheck = result == 16\nassert check"],
    ),
}


@pytest.mark.parametrize("attack", sorted(OBJECT_ATTACKS))
def test_the_verdict_is_computed_outside_from_plain_data(attack):
    forged, honest, tests = OBJECT_ATTACKS[attack]
    if attack == "names_the_test_does_not_import":
        pytest.importorskip("numpy")
    assert score(forged, tests) == 0.0
    assert score(honest, tests) == 1.0


# ---- 3. failure never pays ----

# f(depth) finds the request on its way (a probe and its token in the runner's frames, or the channel
# socket), answers it with JSON nested `depth` deep, and dies. The depths tried straddle the recursion
# limit of a JSON reader somewhere between the program and the verdict, at any stack depth of its caller.
DEEP_ANSWER = """
import gc, json, os, stat, sys
def _deep(depth):
    return "[" * depth + "]" * depth
def _forge(depth):
    probe, channels = None, []
    frame = sys._getframe(1)
    while frame is not None:
        for value in frame.f_locals.values():
            if isinstance(value, dict) and "token" in value and "steps" in value:
                probe = value
        frame = frame.f_back
    for obj in gc.get_objects():
        if type(obj).__name__ == "_Channel":
            channels.append(obj.fd)
    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                channels.append(fd)
        except OSError:
            pass
    if probe is not None:
        count = sum(len(step["items"]) for step in probe["steps"])
        line = '{"token": "%s", "values": %s, "x": %s}' % (probe["token"], json.dumps(["0"] * count), _deep(depth))
    else:
        line = '{"value": %s}' % _deep(depth)
    for fd in channels:
        try:
            os.write(fd, line.encode() + b"\\n")
        except OSError:
            pass
    os._exit(0)
def f(x):
    _forge(x)
"""
DEPTHS = list(range(880, 1000, 12))


def test_an_answer_that_breaks_the_callers_reader_scores_zero():
    assert score("def f(x):\n    return 1\n", ["assert f(900) == 1"]) == 1.0
    assert [score(DEEP_ANSWER, [f"assert f({depth}) == 1"]) for depth in DEPTHS] == [0.0] * len(DEPTHS)
    nested = "def f(x):\n    v = []\n    for _ in range(x * 50):\n        v = [v]\n    return v\n"
    assert score(nested, ["assert f(900) == 1"]) == 0.0


def test_a_program_that_outlasts_the_pool_scores_zero_not_none():
    """Each call stays under the per-test limit; together they outlast the pool's timeout."""
    slow = "import time\ndef f(x):\n    time.sleep(0.8)\n    return -1\n"
    tests = [f"assert f({i}) == {i}" for i in range(12)]
    spec = {"limits": {"wall_s": 1.0, "memory_bytes": 1 << 30}, "allow_unsandboxed": UNSANDBOXED}
    fn = functools.partial(code_tests, **spec)
    with RewardPool(workers=1, timeout=4.0) as pool:
        start = time.monotonic()
        scores = pool.score([fn], ["p"], [slow], {"tests": [tests]})
        assert time.monotonic() - start < 12
    assert scores.rewards == [[0.0]]
    assert sandbox_processes() == []


def test_code_tests_called_directly_never_raises_on_program_output():
    programs = [
        "def f(x):\n    return 10 ** 4000 * 10 ** 4000\n",  # an int with more digits than str() allows
        "def f(x):\n    class Bad:\n        def __repr__(self): raise SystemExit\n    return Bad()\n",
        "import os\ndef f(x):\n    os.write(1, b'\\xff\\xfe' * 100000)\n    return float('nan')\n",
        "def f(x):\n    return {frozenset({1}): [bytearray(b'x'), 1j, range(3)]}\n",
    ]
    tests = ["assert f(1) == 2", "assert f(2) != 2", "assert str(f(3)) == '1'"]
    assert [score(program, tests) for program in programs] == [0.0, 0.0] + [pytest.approx(1 / 3)] * 2


def test_a_lone_surrogate_scores_the_failure_reward_not_none():
    """A completion is text the policy chose: one that is not valid UTF-8 (a lone surrogate) is a wrong program, in
    the reward pool as called directly; the verifier stays up (its next program scores)."""
    program = "def f(x):\n    return x + 1  # \ud800\n"
    spec = {"limits": {"wall_s": 2.0, "memory_bytes": 1 << 30}, "allow_unsandboxed": UNSANDBOXED}
    io_tests = [{"input": "1", "output": "2"}]
    assert score(program, ["assert f(1) == 2"]) == 0.0 and score("print(2)  # \ud800\n", io_tests) == 0.0
    with RewardPool(workers=1, timeout=30.0) as pool:
        scores = pool.score(
            [functools.partial(code_tests, **spec)],
            ["p"] * 2,
            [program, "f = lambda x: x + 1"],
            {"tests": [["assert f(1) == 2"]] * 2},
        )
    assert scores.rewards == [[0.0, 1.0]] and scores.failures == []


# ---- 4. the program chooses both sides ----

BOTH_SIDES = [
    "assert f(3) == g(3)",
    "r = f(3)\nassert r == g(3)",
    "assert f(1) + f(2) == f(3)",
    "def same(a, b):\n    return a == b\nassert same(f(3), g(3))",
    "assert f(3) == EXPECTED",
]


def test_tests_that_compare_only_program_values_fail_for_every_program():
    """A wrong program that makes both sides equal would pass them: they are refused when the tests are read (a
    warning names each), so they pay no program. Comparisons with a value of the test's own still judge."""
    wrong = "f = g = lambda x: 0\nEXPECTED = 0\n"
    assert [score(wrong, [test]) for test in BOTH_SIDES] == [0.0] * len(BOTH_SIDES)
    assert all(
        parse_assert(test).problem.startswith("it compares values that all come from the program")
        for test in BOTH_SIDES
    )
    judged = [
        "assert f(3) == 6",
        "for got, want in zip(f([1, 2]), [2, 4]):\n    assert got == want",
        "res = f([1, 2])\nfor i in range(len(res)):\n    assert res[i] == [2, 4][i]",
        "for i, v in enumerate(f([1, 2])):\n    assert v == [2, 4][i]",
    ]
    right = "def f(x):\n    return [2 * v for v in x] if isinstance(x, list) else 2 * x\n"
    assert score(right, judged) == 1.0 and score(wrong, judged) == 0.0

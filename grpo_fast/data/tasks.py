"""Synthetic verifiable tasks with exact rewards.

Each task builds rows `{"prompt": str, "answer": str, ...}` deterministically from a seed; `TASKS` names each
task's builder and the reward functions (grpo_fast.rewards.registry names) that verify it.

- modular arithmetic: "(37+85)%10=" -> "2". The answer depends on the operands modulo m, so held-out
  prompts (different operands) test the rule, not memorised strings.
- countdown: "3,5,7>22=" -> any expression using each number exactly once that evaluates to the target,
  e.g. "3*5+7". Rows keep the reference solution in "answer".
- code functions: "mul 7 mod 10:" -> a Python program defining f with f(x) = x*7 % 10, checked by hidden
  assert tests in the code sandbox (`code_tests`, column "tests"); e.g. "def f(x):return x*7%10".
- products: "1234*5678=" -> "7006652", exact; a task for a model with a multiply tool (the demo's tool task).
"""

from __future__ import annotations

import ast
import operator
import random

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def modular_arithmetic_dataset(
    n: int,
    seed: int = 0,
    modulus: int = 10,
    max_operand: int = 100,
    ops: str = "+",
    exclude: set[str] | None = None,
    fixed_b: int | None = None,
    min_operand: int = 0,
) -> list[dict]:
    """`n` rows of "(a op b)%m=" with answer str((a op b) mod m); a, b uniform in [min_operand, max_operand)
    (b fixed to `fixed_b` when given). Prompts in `exclude` are skipped (keeps held-out prompts out of
    training); disjoint operand ranges do the same from a config file."""
    rng = random.Random(seed)
    rows, seen = [], set(exclude or ())
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise ValueError("modular_arithmetic_dataset: prompt space too small for n distinct prompts")
        a, b, op = rng.randrange(min_operand, max_operand), rng.randrange(min_operand, max_operand), rng.choice(ops)
        b = b if fixed_b is None else fixed_b
        prompt = f"({a}{op}{b})%{modulus}="
        if prompt in seen:
            continue
        seen.add(prompt)
        rows.append({"prompt": prompt, "answer": str(_OPS[op](a, b) % modulus)})
    return rows


def products_dataset(n: int, seed: int = 0, digits: int = 4, exclude: set[str] | None = None) -> list[dict]:
    """`n` distinct rows of "a*b=" with answer str(a*b), a and b of `digits` digits; prompts in `exclude` skipped."""
    rng = random.Random(seed)
    rows, seen = [], set(exclude or ())
    low, high = 10 ** (digits - 1), 10**digits
    if n > (high - low) ** 2 - len(seen):
        raise ValueError(f"products_dataset: fewer than n={n} distinct prompts of {digits}-digit factors")
    while len(rows) < n:
        a, b = rng.randrange(low, high), rng.randrange(low, high)
        prompt = f"{a}*{b}="
        if prompt not in seen:
            seen.add(prompt)
            rows.append({"prompt": prompt, "answer": str(a * b)})
    return rows


def countdown_dataset(n: int, seed: int = 0, num_numbers: int = 3, max_number: int = 9) -> list[dict]:
    """`n` solvable countdown rows "n1,n2,n3>target=" built from a random expression over the numbers."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < n:
        nums = [rng.randint(1, max_number) for _ in range(num_numbers)]
        order = nums[:]
        rng.shuffle(order)
        expr = str(order[0])
        for x in order[1:]:
            expr = f"{expr}{rng.choice('+-*')}{x}"
        target = arithmetic_value(expr)
        if target is None or target < 0:
            continue
        rows.append(
            {
                "prompt": f"{','.join(map(str, nums))}>{target}=",
                "answer": expr,
                "numbers": nums,
                "target": target,
            }
        )
    return rows


MAX_EXPRESSION_CHARS = 64
"""The longest arithmetic expression parsed: a countdown answer uses a handful of numbers, far fewer characters. A
longer text is no answer; parsing it could exhaust Python's recursion (3000 `-` then `1` nests 3000 deep)."""


def _parse_arithmetic(expr: str) -> ast.Expression | None:
    """The syntax tree of `expr`, or None when it is longer than MAX_EXPRESSION_CHARS or does not parse."""
    if len(expr) > MAX_EXPRESSION_CHARS:
        return None
    try:
        return ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError):
        return None


def integer_literals(expr: str) -> list[int] | None:
    """The integer literals of an expression in source order, or None when it does not parse (or is longer than
    MAX_EXPRESSION_CHARS) or has others."""
    tree = _parse_arithmetic(expr)
    if tree is None:
        return None
    constants = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)]
    if any(type(v) is not int for v in constants):
        return None
    return constants


def arithmetic_value(expr: str) -> int | None:
    """Integer value of an expression of non-negative int literals, + - * and parentheses, at most
    MAX_EXPRESSION_CHARS long; else None."""
    tree = _parse_arithmetic(expr)
    if tree is None:
        return None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            return node.value
        if isinstance(node, ast.BinOp):
            op = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}.get(type(node.op))
            if op is not None:
                return op(ev(node.left), ev(node.right))
        raise ValueError("unsupported expression")

    try:
        return ev(tree)
    except ValueError:
        return None


def code_functions_dataset(
    n: int | None = None,
    seed: int = 0,
    multipliers: tuple[int, ...] = tuple(range(2, 10)),
    moduli: tuple[int, ...] = tuple(range(5, 13)),
    exclude: set[str] | None = None,
) -> list[dict]:
    """Rows for every (k, m) of multipliers x moduli (shuffled by `seed`, the first `n` when given):
    prompt "mul {k} mod {m}:", a reference program in "answer", and four hidden tests in "tests" that a
    program defining f(x) = x*k % m passes (equality, a comprehension, a tolerance, a truth test).
    Prompts in `exclude` are skipped."""
    rows = []
    for k in multipliers:
        for m in moduli:
            prompt = f"mul {k} mod {m}:"
            if prompt in (exclude or ()):
                continue
            tests = [
                f"assert f(3) == {3 * k % m}",
                f"assert all(f(x) == x * {k} % {m} for x in [5, 6])",
                f"assert abs(f(11) - {11 * k % m}) < 1e-9",
                f"assert not f({m})",
            ]
            rows.append({"prompt": prompt, "answer": f"def f(x):return x*{k}%{m}", "tests": tests})
    random.Random(seed).shuffle(rows)
    return rows if n is None else rows[:n]


TASKS = {
    "modular_arithmetic": (modular_arithmetic_dataset, ["exact_match"]),
    "countdown": (countdown_dataset, ["countdown"]),
    "code_functions": (code_functions_dataset, ["code_tests"]),
    "products": (products_dataset, ["exact_match"]),
}
"""task name -> (dataset builder, names of the reward functions that verify it)."""

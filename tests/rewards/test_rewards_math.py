"""Math accuracy: equivalence table, reference handling, and completions that try to game the check."""

from __future__ import annotations

import pytest

from grpo_fast.rewards import math_accuracy
from grpo_fast.rewards.extract import answer_slots

# (model answer inside \boxed{}, reference, equivalent?)
EQUIVALENCE = [
    # fractions and decimals
    ("0.5", "1/2", True),
    ("\\frac{1}{2}", "0.5", True),
    ("\\dfrac{3}{4}", "0.75", True),
    ("\\tfrac{3}{4}", "3/4", True),
    ("\\frac12", "\\frac{1}{2}", True),
    ("2/4", "1/2", True),
    ("0.333", "1/3", False),
    ("0.6", "2/3", False),
    ("\\frac{2}{3}", "\\frac{3}{2}", False),
    # integers, signs, formatting
    ("42", "42", True),
    ("042", "42", True),
    ("42.0", "42", True),
    ("1,000", "1000", True),
    ("-3", "-3", True),
    ("-3", "3", False),
    ("-\\frac{1}{2}", "-0.5", True),
    ("\\frac{-1}{2}", "-\\frac{1}{2}", True),
    ("-(-2)", "2", True),
    ("43", "42", False),
    ("12", "123", False),
    ("123", "12", False),
    ("3.14", "3.14159", False),
    # percentages: p% matches p and p/100 (math-verify's reading)
    ("5\\%", "5", True),
    ("5\\%", "0.05", True),
    ("10\\%", "0.1", True),
    ("50\\%", "\\frac{1}{2}", True),
    ("25\\%", "0.25", True),
    ("25\\%", "0.3", False),
    # scientific notation
    ("1e3", "1000", True),
    ("1.5e-3", "0.0015", True),
    ("2.5E2", "250", True),
    ("1.5\\times10^{3}", "1500", True),
    ("3 \\times 10^{-2}", "0.03", True),
    ("1e3", "100", False),
    # LaTeX expressions
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", True),
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", True),
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("\\sqrt{3}", "\\sqrt{2}", False),
    ("\\pi", "\\pi", True),
    ("2\\pi", "\\pi", False),
    ("\\frac{\\pi}{2}", "\\pi/2", True),
    ("x^2+2x+1", "(x+1)^2", True),
    ("x^2+1", "(x+1)^2", False),
    ("2^{10}", "1024", True),
    ("\\left(3\\right)", "3", True),
    ("e^{0}", "1", True),
    # units and text stripped
    ("5\\text{ cm}", "5", True),
    ("5 \\text{ apples}", "5", True),
    ("90^\\circ", "90", True),
    ("\\$12", "12", True),
    ("7\\text{ cm}", "5", False),
    # equations with the variable
    ("x = 5", "5", True),
    ("x=-2", "-2", True),
    ("y = 5", "6", False),
    ("y = 2x + 1", "2x+1", True),
    ("f(3) = 7", "7", True),
    # several operands joined by or / = / text, or juxtaposed: each would count as one of them
    ("4(5)", "9", False),
    ("4 \\lor 5", "5", False),
    ("4 \\vee 5", "5", False),
    ("4 or 5", "5", False),
    ("4 = 5", "5", False),
    ("2+2=4", "4", False),
    ("4 \\text{ (or } 5)", "5", False),
    ("4 \\text{ or } 5", "5", False),
    ("4 \\text{ and } 5", "5", False),
    ("2(3+4)", "14", True),
    ("3\\frac{1}{2}", "3.5", True),
    ("5\\text{ m}^2", "5", True),
    ("\\text{(B)}", "B", True),
    # intervals
    ("[1, 2)", "[1,2)", True),
    ("(1, 2]", "[1, 2)", False),
    ("(-\\infty, 0)", "(-\\infty,0)", True),
    ("[0, \\infty)", "(0, \\infty)", False),
    ("(1,3) \\cup (4,5)", "(1,3)\\cup(4,5)", True),
    # sets and tuples
    ("\\{1, 2\\}", "\\{2, 1\\}", True),
    ("\\{1, 2, 3\\}", "\\{1, 2\\}", False),
    ("(1, 2)", "(1, 2)", True),
    ("(2, 1)", "(1, 2)", False),
    # multiple choice
    ("B", "B", True),
    ("\\text{(B)}", "B", True),
    ("C", "B", False),
    # matrices
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True),
    ("\\begin{pmatrix}1\\\\3\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", False),
]


def _reward(completion: str, reference) -> float | None:
    return math_accuracy(["q"], [completion], [reference])[0]


@pytest.mark.parametrize(("answer", "reference", "equivalent"), EQUIVALENCE)
def test_equivalence_table(answer, reference, equivalent):
    completion = f"Let me work it out. The final answer is $\\boxed{{{answer}}}$."
    assert _reward(completion, reference) == (1.0 if equivalent else 0.0)


def test_table_is_big_enough():
    assert len(EQUIVALENCE) >= 60
    assert sum(not eq for *_, eq in EQUIVALENCE) >= 20


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("<think>2+2</think><answer>4</answer>", 1.0),
        ("<answer> $4$ </answer>", 1.0),
        ("<answer>\\boxed{4}</answer>", 1.0),
        ("first \\boxed{3}, no wait: \\boxed{4}", 1.0),
        ("\\boxed{4} is it, or rather \\boxed{3}", 0.0),
        ("\\boxed{4}.", 1.0),
        ("\\boxed{\\frac{8}{2}}", 1.0),
        ("\\boxed{\\{4\\}}", 1.0),
        ("\\fbox{4}", 1.0),
    ],
)
def test_slots_and_last_one_wins(completion, reward):
    assert _reward(completion, "4") == reward


def test_configured_pattern():
    rewards = math_accuracy(["q"] * 2, ["Final: 4", "Final: 5"], ["4", "4"], pattern=r"Final:\s*(\S+)")
    assert rewards == [1.0, 0.0]


@pytest.mark.parametrize("reference", ["", "   ", None, "\\frac{", "\\boxed{", "}{", "abc\\", "???"])
def test_unparseable_reference_is_skipped_never_rewarded(reference):
    # The completion copies the broken reference verbatim: it must not earn 1.0.
    completion = f"\\boxed{{{reference}}}" if reference else "\\boxed{}"
    assert _reward(completion, reference) is None


def test_numeric_reference():
    assert math_accuracy(["q"] * 3, ["\\boxed{0.5}", "\\boxed{1/2}", "\\boxed{2}"], [0.5, 0.5, 2]) == [1.0, 1.0, 1.0]


ADVERSARIAL = {
    "many boxed answers": "".join(f"\\boxed{{{i}}} " for i in range(10)) + "\\boxed{4}",
    "candidate list in one box": "\\boxed{1, 2, 3, 4, 5}",
    "either-or in one box": "\\boxed{3 \\text{ or } 4}",
    "answer only in reasoning": "2 + 2 = 4, so the answer is 4.",
    "answer in think, not in slot": "<think>the answer is 4</think> I am not sure.",
    "empty box": "The answer is 4. \\boxed{}",
    "whitespace box": "\\boxed{   }",
    "answer tag then different box": "<answer>4</answer> actually \\boxed{5}",
    "number and words": "\\boxed{4 and also 7}",
    "prefix only": "\\boxed{45}",
    "unclosed box": "\\boxed{4",
    "huge answer": "\\boxed{" + "4" * 100_000 + "}",
    "huge expression": "\\boxed{" + "+".join(["1"] * 5000) + "}",
    "huge completion": "4 " * 200_000,
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_gaming_attempts_earn_zero(name):
    assert _reward(ADVERSARIAL[name], "4") == 0.0


def test_without_required_slot_falls_back_to_whole_text():
    assert math_accuracy(["q"], ["so it is 4"], ["4"], require_slot=False) == [1.0]
    assert math_accuracy(["q"], ["so it is 4"], ["4"]) == [0.0]


def test_answer_slots_nested_braces():
    slots = answer_slots("\\boxed{\\frac{1}{\\sqrt{2}}} and <answer>x</answer>")
    assert [s.content for s in slots] == ["\\frac{1}{\\sqrt{2}}", "x"]


SLOW_ANSWER = r"\boxed{2^{2^{40}}}"  # sympy would spend hours on it


def test_time_limit_holds_off_the_main_thread():
    import threading
    import time

    out = {}

    def score():
        start = time.monotonic()
        out["rewards"] = math_accuracy(["p"] * 2, [SLOW_ANSWER, r"\boxed{1/2}"], ["5", "0.5"], timeout_s=2)
        out["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=score, daemon=True)
    thread.start()
    thread.join(40)
    assert not thread.is_alive(), "math_accuracy ignored its time limit off the main thread"
    assert out["rewards"] == [0.0, 1.0]
    assert out["seconds"] < 30


def test_time_limit_holds_in_a_worker_process():
    import time

    from grpo_fast.rewards import RewardPool

    with RewardPool(workers=1, timeout=60) as pool:
        pool.score([math_accuracy], ["p"], ["warm-up"], {"answer": ["1"]})
        start = time.monotonic()
        scores = pool.score([math_accuracy], ["p"], [SLOW_ANSWER], {"answer": ["5"]})
    assert scores.rewards == [[0.0]] and not scores.failures  # its own limit (5 s), not the pool's kill
    assert time.monotonic() - start < 30

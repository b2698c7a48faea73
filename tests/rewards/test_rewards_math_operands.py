"""A boxed answer with two values side by side, or joined by what makes no single value of them, earns nothing:
math-verify reads `4 \\; 5` as the mixed number 4 + 5 = 9 and keeps one side of `4 \\to 5`, so each of these would
be credited for an answer it never gave (every attack below was credited before this guard). The answers people
write with spacing, arrows, mixed numbers, units, intervals and matrices are still credited."""

from __future__ import annotations

import pytest

from grpo_fast.rewards.math_answer import score_answer

SUMMED = ["4 \\; 5", "4\\quad 5", "4 \\! 5", "4 \\, 5", "4\\ 5", "4 \\qquad 5", "4 5", "4 \\thinspace 5", "4~5"]
SUMMED += ["4\\,\\,5", "4 \\medspace 5", "4\\hspace{1em}5", "4 \\phantom{0} 5", "4 \\displaystyle 5", "4 \\ldots 5"]
SUMMED += ["{4}{5}", "4{5}", "{4} {5}", "\\text{4}\\;\\text{5}", "\\mathbf{4}\\;5", "(4) \\; 5", "\\frac{4}{1} \\; 5"]
SUMMED += [
    "4\\left(5\\right)",
    "4(5)",
    "4(+5)",
    "4 \\frac{5}{1}",
    "4\\dfrac{10}{2}",
    "4\\binom{5}{1}",
    "4\\tfrac{5}{1}",
]
ONE_SIDE = ["\\to", "\\mid", "\\land", "\\equiv", "\\\\", "\\\\[2pt]", "\\newline", "\\cr", "&", "|", "\\|", "\\colon"]
ONE_SIDE += ["\\rightarrow", "\\Rightarrow", "\\implies", "\\iff", "\\mapsto", "\\wedge", "\\therefore", "\\because"]
ONE_SIDE += ["\\sim", "\\simeq", "\\cong", "\\propto", "\\parallel", "\\perp", "\\vdash", "\\in", "\\ni", "\\dots"]
ONE_SIDE += ["\\circ", "\\oplus", "\\cap", "\\cup", "\\setminus", "\\max", "\\gcd", "\\bmod", "\\ast"]
ATTACKS = [(answer, "9") for answer in SUMMED]
ATTACKS += [(f"4 {joint} 5", reference) for joint in ONE_SIDE for reference in ("4", "5")]
ATTACKS += [(answer, "5") for answer in ("{4 \\to 5}", "\\left(4 \\to 5\\right)", "(4) \\to 5", "\\frac{4}{1} \\to 5")]
ATTACKS += [("4 \\to \\frac{5}{1}", "5"), ("4\\frac{6}{3}", "6"), ("(4)\\frac{1}{2}", "4.5"), ("4\\sqrt{25}", "9")]

CREDITED = [
    ("\\frac{1}{2}", "0.5"),
    ("4 \\frac{1}{2}", "4.5"),  # a mixed number
    ("4\\frac12", "4.5"),
    ("-4\\frac{1}{2}", "-4.5"),
    ("1\\frac{1}{3}", "\\frac{4}{3}"),
    ("\\frac 1 2", "0.5"),
    ("2\\sqrt 3", "2\\sqrt{3}"),
    ("2 \\sqrt{3}", "2\\sqrt{3}"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("3\\sqrt{2} + 2\\sqrt{3}", "3\\sqrt{2}+2\\sqrt{3}"),
    ("6\\sqrt{3}\\pi", "6\\sqrt{3}\\pi"),
    ("2\\frac{\\pi}{3}", "\\frac{2\\pi}{3}"),
    ("2\\left(\\sqrt{3}+1\\right)", "2\\sqrt{3}+2"),
    ("\\frac{1}{2}\\pi", "\\pi/2"),
    ("2 \\pi", "2\\pi"),
    ("3 \\cdot 10^5", "300000"),
    ("1.5 \\times 10^{3}", "1500"),
    ("\\log_2 8", "3"),
    ("\\log_{2} 8", "3"),
    ("\\lim_{x \\to 0} 5", "5"),
    ("x \\in [1, 2]", "[1,2]"),
    ("(-\\infty, 1) \\cup (2, \\infty)", "(-\\infty,1)\\cup(2,\\infty)"),
    ("(1,2) \\cup (3,4)", "(1,2)\\cup(3,4)"),
    ("\\{1, 2\\}", "\\{1,2\\}"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("x \\le 5", "x \\le 5"),
    ("3 < x < 5", "3<x<5"),
    ("x = 5", "5"),
    ("a_1 = 5", "5"),
    ("f(2) = 5", "5"),
    ("5 \\text{ cm}", "5"),
    ("5\\,\\mathrm{m}", "5"),
    ("5 \\text{ dollars}", "5"),
    ("\\$5", "5"),
    ("5\\%", "5"),
    ("10\\%", "0.1"),
    ("30^\\circ", "30"),
    ("2^{10}", "1024"),
    ("10!", "3628800"),
    ("\\binom{5}{2}", "10"),
    ("\\mathbf{2}", "2"),
    ("1{,}000", "1000"),
    ("1,000", "1000"),
    ("12:30", "12:30"),
    ("1 : 2", "1/2"),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}"),
    ("x^2 + 2x + 1", "(x+1)^2"),
    ("\\sqrt[3]{2}", "2^{1/3}"),
]


@pytest.mark.parametrize(("answer", "reference"), ATTACKS, ids=[f"{a} vs {r}" for a, r in ATTACKS])
def test_two_values_joined_by_nothing_that_makes_one_earn_nothing(answer, reference):
    assert score_answer(f"The answer is \\boxed{{{answer}}}.", reference) == 0.0


@pytest.mark.parametrize(("answer", "reference"), CREDITED, ids=[f"{a} vs {r}" for a, r in CREDITED])
def test_answers_written_the_usual_ways_are_still_credited(answer, reference):
    assert score_answer(f"The answer is \\boxed{{{answer}}}.", reference) == 1.0

"""Math accuracy: the completion's final answer against the reference, compared with `math-verify`.

Extraction: the last answer slot (`\\boxed{...}`, `<answer>...</answer>`, or matches of `pattern`,
see `extract.py`) is the final answer. Its whole content is the answer: it is parsed as if it were
`\\boxed{content}`, so text around a number ("5 and also 7") does not reduce to its first number.
Plain scientific notation (`1.5e3`) is rewritten to `1.5\\times10^{3}` first, since LaTeX would
read `e` as Euler's number.

Comparison: `math_verify.verify(reference, answer)`, symbolic and numeric (0.5 = 1/2, 10% = 0.1,
intervals, sets, units stripped, `x = 5` against 5).

Rewards: 1.0 equivalent, 0.0 not (or no answer), None when the reference cannot be parsed (the sample
is skipped by the trainer rather than pushing the policy either way).

Guards against gaming: with `require_slot` (default) an answer outside any slot earns nothing; more
than `max_distinct_answers` different slot contents earn nothing (listing candidates); an empty slot
or one longer than `max_answer_chars` earns nothing; a slot that lists several values parses as a set
and does not equal a single reference value; a slot with several operands joined otherwise earns
nothing (`joined_operands`): by "or" (`4 \\lor 5`, `4 \\vee 5`, `4 or 5`), by text (`4 \\text{ (or } 5)`;
a unit after one value, `5\\text{ cm}^2`, is fine), by `=` unless each side but the last is a
variable (`x = 5` counts as 5, `4 = 5` and `2+2=4` earn nothing), or side by side with nothing that
makes one value of them (grpo_fast.rewards.answer_shape): spacing (`4 \\; 5`, `4\\quad 5`, `{4}{5}`, which
math-verify would read as the mixed number 4 + 5 = 9), an arrow, relation, logic sign or line break
(`4 \\to 5`, `4 \\mid 5`, `4 \\land 5`, `4 \\equiv 5`, `4 \\\\ 5`, of which it would keep one), a
parenthesized number (`4(5)`). A value next to a command value (`2\\sqrt{3}`) must mean their product:
`4\\sqrt{25}`, which math-verify adds up to 9 like a mixed number, earns nothing; a mixed number
(`4\\frac{1}{2}`, an integer then a proper fraction of integers) is one value.

Percentages follow math-verify: `p\\%` is equivalent to both p and p/100, so `5\\%` matches a reference
of 5 and one of 0.05.

Time limit: parsing and comparing one answer may take `timeout_s` seconds (`2^{2^{40}}` would take
hours), after which it earns 0. math-verify enforces this with SIGALRM, which only a process's main
thread can use; called from any other thread, `math_accuracy` sends its work to a one-process
`RewardPool`, whose worker runs it on its main thread and is killed past `timeout_s` + 5 s.
"""

from __future__ import annotations

import atexit
import functools
import logging
import re
import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from grpo_fast.rewards.answer_shape import explicit_products, joined_values
from grpo_fast.rewards.extract import answer_slots, normalize_slot
from grpo_fast.rewards.pool import RewardPool
from grpo_fast.rewards.registry import reward
from grpo_fast.rewards.self_test import Sample
from grpo_fast.rewards.text import broadcast_column, completion_texts

log = logging.getLogger(__name__)

_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())
_SCIENTIFIC = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+))\s*[eE]\s*([-+]?\d+)\s*$")
_REFERENCE_TIMEOUT_S = 5
_POOL_GRACE_S = 5.0


@reward(
    "math_accuracy",
    kind="accuracy",
    range=(0.0, 1.0),
    samples=(
        Sample("boxed right answer", "So the answer is $\\boxed{\\frac{1}{2}}$.", {"answer": "0.5"}, True),
        Sample("boxed wrong answer", "So the answer is $\\boxed{\\frac{1}{3}}$.", {"answer": "0.5"}, False),
        Sample("many answers listed", " ".join(f"\\boxed{{{k / 10}}}" for k in range(1, 10)), {"answer": "0.5"}, False),
        Sample("answer outside the slot", "The answer is 0.5, I think.", {"answer": "0.5"}, False),
        Sample("answer inside longer text", "\\boxed{0.5 or maybe 0.7}", {"answer": "0.5"}, False),
    ),
)
def math_accuracy(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    answer: Sequence[Any],
    *,
    pattern: str | None = None,
    require_slot: bool = True,
    max_distinct_answers: int = 3,
    max_answer_chars: int = 1000,
    timeout_s: int = 5,
    **_: Any,
) -> list[float | None]:
    """1.0 / 0.0 per completion for its final answer against `answer` (dataset column: one reference
    per completion, a string like "0.5", "\\frac{1}{2}", "[1, 2)" or a number); None where the
    reference does not parse.

    pattern: an extra regex for answer slots (group 1 is the answer), e.g. r"Answer:\\s*(.+)$".
    require_slot: without a slot, reward 0 (True) or fall back to math-verify's own search of the
        whole completion (False).
    max_distinct_answers: more different slot contents than this earns 0.
    max_answer_chars: a final answer longer than this earns 0 (keeps sympy off huge inputs).
    timeout_s: whole seconds one answer may take to parse and compare; past it the answer earns 0.
    """
    texts = completion_texts(completions)
    references = broadcast_column("answer", answer, len(texts))
    options = dict(
        pattern=pattern,
        require_slot=require_slot,
        max_distinct_answers=max_distinct_answers,
        max_answer_chars=max_answer_chars,
        timeout_s=timeout_s,
    )
    if threading.current_thread() is not threading.main_thread():
        return _score_in_worker(texts, references, options)
    return [score_answer(text, ref, **options) for text, ref in zip(texts, references, strict=True)]


def score_answer(
    text: str,
    reference: Any,
    *,
    pattern: str | None = None,
    require_slot: bool = True,
    max_distinct_answers: int = 3,
    max_answer_chars: int = 1000,
    timeout_s: int = 5,
) -> float | None:
    """Reward of one completion text against one reference (see `math_accuracy`); on the main thread."""
    gold = parse_reference(reference)
    if gold is None:
        log.debug("math_accuracy: reference %r does not parse; reward skipped", reference)
        return None
    slots = answer_slots(text, pattern)
    if not slots:
        if require_slot:
            return 0.0
        return float(_verify(gold, _parse(text[-max_answer_chars:], timeout_s), timeout_s))
    if len({normalize_slot(s.content) for s in slots}) > max_distinct_answers:
        return 0.0
    final = slots[-1].content.strip().strip("$").strip().rstrip(".")
    if not final or len(final) > max_answer_chars or joined_operands(final):
        return 0.0
    answer = _parse_slot(final, timeout_s)
    products = explicit_products(final)
    if products is not None and not _same_value(answer, _parse_slot(products, timeout_s), timeout_s):
        return 0.0  # math-verify reads a juxtaposition as a sum (its mixed numbers): `4\sqrt{25}` is not 9
    return float(_verify(gold, answer, timeout_s))


_TEXT = re.compile(r"\\(?:text\w*|mathrm|mbox|operatorname)\s*\{[^{}]*\}")
_SPACING = re.compile(r"\\(?:quad|qquad|[,;:! ])|~")
_UNIT_POWER = re.compile(r"^\s*\^\s*(?:\{[^{}]*\}|\w)")
_OR = re.compile(r"\\(?:lor|vee)(?![A-Za-z])|(?<![A-Za-z\\])or(?![A-Za-z])")
_EQUALS = re.compile(r"(?<![<>!\\])=(?!=)")
_VARIABLE = re.compile(r"^\s*(?:\\[A-Za-z]+|[A-Za-z])(?:_\{?\w+\}?)?(?:\([^()]*\))?\s*$")


def joined_operands(content: str) -> str | None:
    """Why a final answer holds several operands joined by or / text / `=` / nothing (see module doc), or None."""
    if why := joined_values(content):
        return why
    if _OR.search(_TEXT.sub(" ", content)):
        return "operands joined by or"
    parts = [_UNIT_POWER.sub("", _SPACING.sub(" ", part)) for part in _TEXT.split(content)]
    if sum(bool(re.search(r"[A-Za-z0-9]", part)) for part in parts) > 1:
        return "operands joined by text"
    sides = _EQUALS.split(_TEXT.sub(" ", content))
    if len(sides) > 1 and not all(_VARIABLE.match(side) for side in sides[:-1]):
        return "an equation between values"
    return None


@lru_cache(maxsize=4096)
def _parse_reference_str(reference: str) -> tuple | None:
    text = reference.strip().strip("$").strip()
    if not text:
        return None
    parsed = _parse_slot(text, _REFERENCE_TIMEOUT_S)
    # math-verify falls back to the raw string when nothing parses; such a "reference" would match any
    # completion that copies the same broken text, so it counts as unparseable.
    if not any(not isinstance(p, str) for p in parsed):
        return None
    return tuple(parsed)


def parse_reference(reference: Any) -> list | None:
    """math-verify's parse of a reference answer (a string or a number); None when it yields no
    expression (empty, malformed LaTeX)."""
    if reference is None or isinstance(reference, bool):
        return None
    if isinstance(reference, (int, float)):
        reference = repr(reference)
    if not isinstance(reference, str):
        raise TypeError(f"answer: expected a string or a number, got {type(reference).__name__}")
    parsed = _parse_reference_str(reference)
    return list(parsed) if parsed else None


def _parse_slot(content: str, timeout_s: int) -> list:
    m = _SCIENTIFIC.match(content)
    if m:
        content = f"{m.group(1)}\\times10^{{{m.group(2)}}}"
    return _parse(f"\\boxed{{{content}}}", timeout_s)


def _parse(text: str, timeout_s: int) -> list:
    return parse(text, extraction_config=_CONFIG, parsing_timeout=timeout_s)


def _verify(gold: list, answer: list, timeout_s: int) -> bool:
    return bool(answer) and verify(gold, answer, timeout_seconds=timeout_s)


def _same_value(first: list, second: list, timeout_s: int) -> bool:
    """Whether two parses are the same expression (their sympy values, not their texts)."""
    return bool(first) and bool(second) and verify(first[:1], second[:1], timeout_seconds=timeout_s)


def _score_in_worker(texts: list[str], references: list[Any], options: dict) -> list[float | None]:
    """`math_accuracy` for a caller off the main thread: run in the shared one-process pool (its worker
    scores on its main thread, where SIGALRM works); a worker stuck in C code past the grace is killed
    and the answer earns 0."""

    timeout_s = options["timeout_s"]
    with _POOL_LOCK:
        if timeout_s not in _POOLS:
            _POOLS[timeout_s] = RewardPool(workers=1, timeout=timeout_s + _POOL_GRACE_S, failure_reward=0.0)
            atexit.register(_POOLS[timeout_s].close)
        fn = functools.partial(math_accuracy, **options)
        return _POOLS[timeout_s].score([fn], ["" for _ in texts], texts, {"answer": references}).rewards[0]


_POOLS: dict[int, object] = {}  # timeout_s -> RewardPool, started on first use off the main thread
_POOL_LOCK = threading.Lock()

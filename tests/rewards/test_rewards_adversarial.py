"""What a policy writes cannot crash, hang or slow down a verifier that runs in the trainer's process.

Each built-in verifier the trainer may score in-process gets completions built to exhaust Python's recursion
(deep nesting for a recursive-descent parser) or to make a scan quadratic (thousands of unclosed openings, each
scanned to the end of the text): none raises, none credits it, and each call stays far below what the quadratic
scans took (`\\boxed{` 30 000 times unclosed: minutes; 25 000 unclosed `<answer>` tags or 200 000 `<`: tens of
seconds), on a loaded machine too. Also here: the linear slot extraction against its quadratic definition, and the
JSON depth scan against the depth of the parsed value."""

from __future__ import annotations

import json
import random
import re
import time

import pytest

from grpo_fast.rewards import (
    json_schema,
    language_consistency,
    length_penalty,
    math_accuracy,
    overlong_penalty,
    think_format,
)
from grpo_fast.rewards.code import extract_code
from grpo_fast.rewards.extract import answer_slots
from grpo_fast.rewards.json_validation import MAX_JSON_DEPTH, json_depth
from grpo_fast.rewards.sql import extract_sql
from grpo_fast.rewards.tasks import countdown_reward, exact_match_reward

ATTACKS = {
    "minus signs then a digit": "-" * 3000 + "1",
    "a long sum": "1" + "+1" * 100_000,
    "open brackets": "[" * 200_000,
    "open braces": "{" * 200_000,
    "nested JSON objects": '{"a":' * 50_000 + "1" + "}" * 50_000,
    "open parentheses": "(" * 200_000,
    "unclosed boxes": "\\boxed{" * 30_000,
    "nested boxes": "\\boxed{" * 20_000 + "2" + "}" * 20_000,
    "many boxes": "\\boxed{2}" * 20_000,
    "unclosed answer tags": "<answer>" * 25_000,
    "unclosed json fences": "```json" * 30_000,
    "unclosed sql fences": "```sql" * 30_000,
    "code fences on one line": "```" * 100_000,
    "angle brackets": "<" * 200_000,
    "think tags": "<think>" * 30_000,
    "dollar signs": "$" * 200_000,
    "backslashes": "\\" * 200_000,
    "escaped quotes": '"' + '\\"' * 100_000,
}
ACCURACY = {  # verifier -> its columns; each must score every attack 0
    exact_match_reward: {"answer": ["1"]},
    countdown_reward: {"numbers": [[1, 2, 3]], "target": [6]},
    json_schema: {"schema": [{"type": "array"}]},
    math_accuracy: {"answer": ["1"]},
    think_format: {},
}
OTHERS = {  # verifier -> its columns; each must score every attack without raising
    language_consistency: {"language": ["en"]},
    overlong_penalty: {"max_completion_length": 8, "overlong_buffer": 4, "completion_ids": [[0] * 9]},
    length_penalty: {"target_length": 4, "completion_ids": [[0] * 9]},
}
SECONDS = 5.0  # per call; each takes milliseconds (math_accuracy: its parse of one short answer)


def _name(fn) -> str:
    return getattr(fn, "__name__", repr(fn))


@pytest.mark.parametrize("attack", list(ATTACKS), ids=list(ATTACKS))
def test_no_in_process_verifier_raises_credits_or_stalls_on_an_attack(attack):
    completion = ATTACKS[attack]
    for fn, columns in {**ACCURACY, **OTHERS}.items():
        start = time.perf_counter()
        (reward,) = fn(["p"], [completion], **columns)
        seconds = time.perf_counter() - start
        assert seconds < SECONDS, f"{_name(fn)} took {seconds:.1f} s on {attack}"
        if fn in ACCURACY:
            assert reward == 0.0, f"{_name(fn)} credited {attack}"
    for extract in (extract_sql, extract_code):
        start = time.perf_counter()
        extract(completion)
        assert time.perf_counter() - start < SECONDS, f"{_name(extract)} on {attack}"


def test_json_deeper_than_the_bound_earns_nothing_and_shallower_json_is_still_judged():
    schema = [{"type": "array"}]
    deep, shallow = MAX_JSON_DEPTH + 1, MAX_JSON_DEPTH
    assert json_schema(["p"], ["[" * deep + "]" * deep], schema=schema) == [0.0]
    assert json_schema(["p"], ["[" * shallow + "]" * shallow], schema=schema) == [1.0]
    assert json_schema(["p"], ['["[[[[", "\\\\", "\\"[", {"a": "]]"}]'], schema=schema) == [1.0]


def _random_json(rng: random.Random, depth: int):
    strings = ["[", "]", "{", "}", '"', "\\", '\\"', "x", "[{", "\\\\", ""]
    if depth == 0 or rng.random() < 0.3:
        return rng.choice([1, None, "".join(rng.choices(strings, k=rng.randint(0, 4)))])
    if rng.random() < 0.5:
        return [_random_json(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return {"".join(rng.choices(strings, k=2)): _random_json(rng, depth - 1) for _ in range(rng.randint(0, 3))}


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def test_json_depth_is_the_depth_of_the_parsed_value():
    rng = random.Random(0)
    for _ in range(2000):
        value = _random_json(rng, 6)
        text = json.dumps(value, indent=rng.choice([None, 1]))
        assert json_depth(text) == _depth(value), text


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def _slots_by_definition(text: str, pattern: str | None) -> list[tuple[str, int, int]]:
    """The slots as the module doc defines them, computed the direct (quadratic) way: every box scanned to its
    closing brace, every tag and pattern match, then those that enclose another dropped."""
    slots = []
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            slots.append((text[m.end() : i - 1], m.start(), i))
    for regex in [_ANSWER_TAG] + ([re.compile(pattern)] if pattern else []):
        group = 1 if regex.groups else 0
        slots += [(m.group(group), m.start(), m.end()) for m in regex.finditer(text)]
    inner = [s for s in slots if not any(o != s and s[1] <= o[1] and o[2] <= s[2] for o in slots)]
    return sorted({(s[1], s[2]): s for s in inner}.values(), key=lambda s: (s[2], s[1]))


def test_answer_slots_are_the_slots_of_their_definition():
    rng = random.Random(0)
    pieces = ["\\boxed{", "\\fbox {", "{", "}", "<answer>", "</answer>", "<ANSWER>", "x", "1", " ", "Answer: 3"]
    for _ in range(5000):
        text = "".join(rng.choices(pieces, k=rng.randint(0, 14)))
        pattern = rng.choice([None, r"Answer:\s*(\d)", r"x"])
        found = [(s.content, s.start, s.end) for s in answer_slots(text, pattern)]
        assert found == _slots_by_definition(text, pattern), (text, pattern)

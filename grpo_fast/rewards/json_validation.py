"""JSON-schema reward for instruction-following data: the completion's JSON must validate.

The JSON is the last ```json fenced block of the completion, else the whole completion (stripped).
Reward 1.0 when it parses and validates against the row's `schema` (a dict, or its JSON text), 0.0
when it does not (or nests arrays and objects more than MAX_JSON_DEPTH deep: Python's parser and the
validator recurse per level), None when the schema itself is invalid (the row cannot be judged).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

import jsonschema

from grpo_fast.rewards.registry import reward
from grpo_fast.rewards.self_test import Sample
from grpo_fast.rewards.text import broadcast_column, completion_texts

log = logging.getLogger(__name__)

_JSON_FENCE = re.compile(r"```json[^\n`]*\n(.*?)```", re.DOTALL | re.IGNORECASE)  # no "`" in its info string
_JSON_STRUCTURE = re.compile(r'[\[\]{}"\\]')
MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects scored; deeper JSON earns 0 unparsed (see module doc)."""


def extract_json_text(text: str) -> str:
    """The JSON part of a completion (see module doc)."""
    blocks = _JSON_FENCE.findall(text)
    return blocks[-1].strip() if blocks else text.strip()


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON text (brackets inside strings do not count), found in one
    pass over its brackets, quotes and backslashes."""
    depth = deepest = 0
    in_string, escaped = False, -1  # escaped: the position of a character a backslash escapes
    for m in _JSON_STRUCTURE.finditer(text):
        char, at = m.group(), m.start()
        if in_string:
            if at == escaped:
                continue
            if char == "\\":
                escaped = at + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


@reward(
    "json_schema",
    kind="accuracy",
    range=(0.0, 1.0),
    samples=(
        Sample("valid object", '{"a": 1}', {"schema": {"type": "object", "required": ["a"]}}, True),
        Sample("missing field", '{"b": 1}', {"schema": {"type": "object", "required": ["a"]}}, False),
        Sample("not JSON", "a = 1", {"schema": {"type": "object", "required": ["a"]}}, False),
    ),
)
def json_schema(
    prompts: Sequence[Any], completions: Sequence[Any], schema: Sequence[Any], **_: Any
) -> list[float | None]:
    """1.0 / 0.0 per completion for whether its JSON validates against `schema` (dataset column)."""
    texts = completion_texts(completions)
    schemas = broadcast_column("schema", schema, len(texts))
    return [_score(text, s) for text, s in zip(texts, schemas, strict=True)]


def _score(text: str, schema: Any) -> float | None:
    try:
        schema = json.loads(schema) if isinstance(schema, str) else schema
        validator = jsonschema.validators.validator_for(schema)
        validator.check_schema(schema)
    except (ValueError, jsonschema.SchemaError) as exc:
        log.debug("json_schema: invalid schema %r: %s", schema, exc)
        return None
    answer = extract_json_text(text)
    if json_depth(answer) > MAX_JSON_DEPTH:
        return 0.0
    try:
        value = json.loads(answer, parse_constant=_not_json)
    except ValueError:
        return 0.0
    return 1.0 if validator(schema).is_valid(value) else 0.0


def _not_json(constant: str) -> None:
    """NaN and ±Infinity: Python's reader accepts them, JSON does not (and NaN passes every range check)."""
    raise ValueError(f"{constant} is not JSON")

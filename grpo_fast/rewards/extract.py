"""Final-answer slots in a completion: `\\boxed{...}` (nested braces), `<answer>...</answer>`, or a
configured regex.

A slot is a span of the completion that holds an answer. `answer_slots` returns their contents in
order of position; the last one is the final answer. A slot that contains another slot (an
`<answer>` wrapping a `\\boxed{}`) is dropped in favour of the inner one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class Slot:
    """One answer slot: `content` is the text inside, `start`/`end` the span of the whole slot."""

    content: str
    start: int
    end: int


def boxed_slots(text: str) -> list[Slot]:
    """Every `\\boxed{...}` / `\\fbox{...}` with balanced braces; an unclosed box is ignored."""
    slots = []
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            slots.append(Slot(text[m.end() : i - 1], m.start(), i))
    return slots


def pattern_slots(text: str, pattern: str | re.Pattern) -> list[Slot]:
    """Matches of a user regex; the slot content is group 1 if the pattern has a group, else the match."""
    regex = re.compile(pattern) if isinstance(pattern, str) else pattern
    group = 1 if regex.groups else 0
    return [Slot(m.group(group), m.start(), m.end()) for m in regex.finditer(text)]


def answer_slots(text: str, pattern: str | re.Pattern | None = None) -> list[Slot]:
    """All answer slots in position order: boxed, `<answer>` tags and matches of `pattern`, without
    slots that enclose another slot."""
    slots = boxed_slots(text) + pattern_slots(text, _ANSWER_TAG)
    if pattern is not None:
        slots += pattern_slots(text, pattern)
    inner = [
        s for s in slots if not any(o is not s and s.start <= o.start and o.end <= s.end and o != s for o in slots)
    ]
    unique = {(s.start, s.end): s for s in inner}
    return sorted(unique.values(), key=lambda s: (s.end, s.start))


def normalize_slot(content: str) -> str:
    """Content of a slot for counting distinct answers: no `$`, whitespace, or trailing period."""
    return re.sub(r"\s+|\$", "", content).rstrip(".")

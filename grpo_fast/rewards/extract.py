"""Final-answer slots in a completion: `\\boxed{...}` (nested braces), `<answer>...</answer>`, or a
configured regex.

A slot is a span of the completion that holds an answer. `answer_slots` returns their contents in
order of position; the last one is the final answer. A slot that contains another slot (an
`<answer>` wrapping a `\\boxed{}`) is dropped in favour of the inner one.

Everything here takes time linear in the completion's length, whatever it holds (a policy that writes
`\\boxed{` thousands of times, unclosed, or thousands of nested boxes): the braces are matched in one pass,
each `<answer>` finds its closing tag by one search forward, and enclosing slots are found from the slots
sorted by position. Only the slots kept are cut out of the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_OPEN = re.compile(r"<answer>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"</answer>", re.IGNORECASE)


@dataclass(frozen=True)
class Slot:
    """One answer slot: `content` is the text inside, `start`/`end` the span of the whole slot."""

    content: str
    start: int
    end: int


_Span = tuple[int, int, int, int]  # (slot start, content start, content end, slot end)


def _boxed_spans(text: str) -> list[_Span]:
    """Every `\\boxed{...}` / `\\fbox{...}` with balanced braces; an unclosed box is ignored."""
    closing: dict[int, int] = {}  # position of each "{" -> of its "}"
    opened: list[int] = []
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            opened.append(m.start())
        elif opened:
            closing[opened.pop()] = m.start()
    spans = []
    for m in _BOXED.finditer(text):
        end = closing.get(m.end() - 1)
        if end is not None:
            spans.append((m.start(), m.end(), end, end + 1))
    return spans


def _answer_tag_spans(text: str) -> list[_Span]:
    """Every `<answer>...</answer>` (case-insensitive), each ending at the first closing tag after it, as the
    regex `<answer>(.*?)</answer>` finds them."""
    spans, pos = [], 0
    while (opening := _ANSWER_OPEN.search(text, pos)) and (closing := _ANSWER_CLOSE.search(text, opening.end())):
        spans.append((opening.start(), opening.end(), closing.start(), closing.end()))
        pos = closing.end()
    return spans


def _pattern_spans(text: str, pattern: str | re.Pattern) -> list[_Span]:
    """Matches of a user regex; the slot content is group 1 if the pattern has a group, else the match."""
    regex = re.compile(pattern) if isinstance(pattern, str) else pattern
    group = 1 if regex.groups else 0
    return [(m.start(), m.start(group), m.end(group), m.end()) for m in regex.finditer(text)]


def _innermost(spans: list[_Span]) -> list[_Span]:
    """The spans (one per distinct slot span) that enclose no other slot span."""
    unique = sorted({(s[0], s[3]): s for s in spans}.values(), key=lambda s: (s[0], s[3]))
    kept, nearest_end = [], None  # nearest_end: the smallest end of the spans after the current one
    for k in range(len(unique) - 1, -1, -1):
        start, *_, end = unique[k]
        shares_start = k > 0 and unique[k - 1][0] == start  # ... with a shorter span, which it encloses
        if not shares_start and (nearest_end is None or nearest_end > end):
            kept.append(unique[k])
        nearest_end = end if nearest_end is None else min(nearest_end, end)
    return kept


def answer_slots(text: str, pattern: str | re.Pattern | None = None) -> list[Slot]:
    """All answer slots in position order: boxed, `<answer>` tags and matches of `pattern`, without
    slots that enclose another slot."""
    spans = _boxed_spans(text) + _answer_tag_spans(text)
    if pattern is not None:
        spans += _pattern_spans(text, pattern)
    slots = [Slot(text[inner:inner_end], start, end) for start, inner, inner_end, end in _innermost(spans)]
    return sorted(slots, key=lambda s: (s.end, s.start))


def normalize_slot(content: str) -> str:
    """Content of a slot for counting distinct answers: no `$`, whitespace, or trailing period."""
    return re.sub(r"\s+|\$", "", content).rstrip(".")

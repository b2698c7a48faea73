"""Language consistency (DeepSeek-R1's fix for language mixing): the share of the reasoning's letters
written in the target language's script(s).

Text judged: the inside of `<think>...</think>` when present (R1's definition: the answer after it is not
judged), else the whole completion. Each letter (str.isalpha) is classified by Unicode block; the reward is
letters in the target scripts / letters counted, in [0, 1]; None when there are no letters to count. Notation is
not language: tag names (`<step>`), LaTeX command names (`\\frac`) and, inside fenced code, math (`$...$`,
`$$...$$`) and a command's brace arguments, Latin and Greek words of at most three letters (variables, `sin`,
`def`) are not counted. Every other letter in them is, so that text hidden in a tag, a formula or a code block
counts as the language it is written in (a span dropped whole would hide it).

`language`: an ISO 639-1 code (en, zh, ja, ko, ru, ar, hi, el, he, th, and the Latin-script
languages listed in LANGUAGE_SCRIPTS) or a script name ("latin", "han", ...).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from grpo_fast.rewards.registry import reward
from grpo_fast.rewards.self_test import Sample
from grpo_fast.rewards.text import broadcast_column, completion_texts

SCRIPT_RANGES = {
    "latin": [(0x0041, 0x024F), (0x1E00, 0x1EFF)],
    "greek": [(0x0370, 0x03FF), (0x1F00, 0x1FFF)],
    "cyrillic": [(0x0400, 0x052F)],
    "hebrew": [(0x0590, 0x05FF)],
    "arabic": [(0x0600, 0x06FF), (0x0750, 0x077F), (0xFB50, 0xFDFF), (0xFE70, 0xFEFF)],
    "devanagari": [(0x0900, 0x097F)],
    "thai": [(0x0E00, 0x0E7F)],
    "hangul": [(0x1100, 0x11FF), (0x3130, 0x318F), (0xAC00, 0xD7AF)],
    "kana": [(0x3040, 0x30FF), (0x31F0, 0x31FF), (0xFF66, 0xFF9F)],
    "han": [(0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x2FA1F)],
}
_LATIN_LANGUAGES = ("en", "fr", "de", "es", "it", "pt", "nl", "sv", "da", "no", "fi", "pl", "cs", "tr", "vi", "id")
LANGUAGE_SCRIPTS = {
    **{code: ("latin",) for code in _LATIN_LANGUAGES},
    "zh": ("han",),
    "ja": ("han", "kana"),
    "ko": ("hangul",),
    "ru": ("cyrillic",),
    "uk": ("cyrillic",),
    "ar": ("arabic",),
    "fa": ("arabic",),
    "hi": ("devanagari",),
    "el": ("greek",),
    "he": ("hebrew",),
    "th": ("thai",),
    **{script: (script,) for script in SCRIPT_RANGES},
}
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)
_TAG = re.compile(r"</?[A-Za-z][\w:-]*\s*/?>")  # a name and nothing else: each "<" is tried once, to its end
_NOTATION = re.compile(r"```.*?```|\$\$.*?\$\$|\$[^$]*\$|\\[a-zA-Z]+(?:\{[^{}]*\})*", re.DOTALL)
_COMMAND = re.compile(r"\\[a-zA-Z]+")
_WORD = re.compile(r"[^\W\d_]+")  # a run of letters
_SYMBOL_SCRIPTS = ("latin", "greek")
SYMBOL_LETTERS = 3
"""The longest Latin or Greek word in notation that is a symbol (x, sin, def), not a word of prose."""


def script_of(char: str) -> str | None:
    """The script of one letter, or None when it is in none of SCRIPT_RANGES."""
    code = ord(char)
    for script, ranges in SCRIPT_RANGES.items():
        if any(lo <= code <= hi for lo, hi in ranges):
            return script
    return None


def language_share(text: str, language: str) -> float | None:
    """Share of the letters of `text`'s reasoning (see module doc) in `language`'s scripts."""
    try:
        scripts = LANGUAGE_SCRIPTS[language.lower()]
    except KeyError:
        raise ValueError(f"language: unknown {language!r}; known: {sorted(LANGUAGE_SCRIPTS)}") from None
    m = _THINK.search(text)
    letters = counted_letters(m.group(1) if m else text)
    if not letters:
        return None
    return sum(script_of(c) in scripts for c in letters) / len(letters)


def counted_letters(text: str) -> list[str]:
    """The letters of `text` that are language, not notation (module doc), in order."""
    text = _TAG.sub(" ", text)
    letters, prose_start = [], 0
    for span in _NOTATION.finditer(text):
        letters += [c for c in text[prose_start : span.start()] if c.isalpha()]
        for word in _WORD.findall(_COMMAND.sub(" ", span.group())):
            prose = len(word) > SYMBOL_LETTERS
            letters += [c for c in word if c.isalpha() and (prose or script_of(c) not in _SYMBOL_SCRIPTS)]
        prose_start = span.end()
    return letters + [c for c in text[prose_start:] if c.isalpha()]


@reward(
    "language_consistency",
    kind="format",
    range=(0.0, 1.0),
    samples=(
        Sample("one script", "<think>The sum of two and two is four.</think> 4", {"language": "en"}, True),
        Sample("mixed scripts", "<think>两个加两个 is четыре.</think> 4", {"language": "en"}, False),
    ),
)
def language_consistency(
    prompts: Sequence[Any], completions: Sequence[Any], language: str | Sequence[str] = "en", **_: Any
) -> list[float | None]:
    """Per completion, the share of its reasoning written in `language` (a column or one code for all)."""
    texts = completion_texts(completions)
    languages = broadcast_column("language", language, len(texts))
    return [language_share(text, lang) for text, lang in zip(texts, languages, strict=True)]

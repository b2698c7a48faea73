"""The shape of a final answer's LaTeX: which values stand side by side with nothing that joins them.

math-verify reads two values next to each other as one: an integer followed by a positive rational is a mixed
number, their sum (`4 5` is 9, as `4 \\frac{1}{2}` is 4.5), and a relation, an arrow or a line break between two
values leaves one of them (`4 \\to 5` is 5, `4 \\equiv 5` is the equation 4 = 5, whose right side is compared). A
policy that writes two values so joined is credited for an answer it never gave. The scan here reads the answer
as a string of token kinds:

    N  a number                         A  a command with its arguments (\\sqrt{2}, \\binom{5}{2}, \\frac{6}{3})
    M  a proper fraction of two integer literals (\\frac{1}{2}, \\frac 1 2): the tail of a mixed number
    L  a letter or a named constant     O  an operator, relation or function that joins values (+ = < \\cdot \\log)
    U  a set operation (\\cup \\cap \\setminus): between intervals, not numbers
    S  spacing (\\; \\quad ~ \\hspace{..} \\left, grouping braces), and nothing else
    C  anything else between values: arrows, logic, \\mid, \\equiv, \\\\, &, |, \\ldots, unknown commands
    ( ) brackets (\\{ \\} too);  ! a factorial;  % a percent

Sub- and superscripts (`_{x \\to 0}`, `^{2}`) belong to the value before them and are skipped; text and font
commands (`\\text{...}`, `\\mathbf{...}`) are transparent (their content is scanned). Inside `\\begin ... \\end` (a
matrix, cases) `&` and `\\\\` separate entries (O).

`joined_values` names what joins two values where nothing should: a number right after a value (`4 \\; 5`,
`{4}{5}`, `(4) 5`), a C between two values (`4 \\to 5`, `(4) \\mid x`), a value next to a parenthesized
number (`4(5)`, `4(+5)`, `4 \\left(5\\right)`). `explicit_products` writes `\\cdot` into the remaining
juxtapositions of a value and a command (`2 \\sqrt{3}`, `4 \\sqrt{25}`), but a mixed number's (`4 \\frac{1}{2}`):
the caller compares both readings, which differ where math-verify would add what stands side by side (4 + 5 = 9
for `4 \\sqrt{25}`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_GREEK = (
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi pi varpi rho "
    "varrho sigma varsigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi "
    "Omega"
)
VALUE_COMMANDS = frozenset((_GREEK + " infty emptyset varnothing ell hbar aleph imath jmath").split())
OPERATOR_COMMANDS = frozenset(
    (
        "times cdot div pm mp le leq ge geq lt gt ne neq leqslant geqslant neg lnot "
        "log ln exp sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh coth"
    ).split()
)  # the operators, relations and functions math-verify reads as such (it drops \\max, \\gcd, \\bmod ...: C)
SET_OPERATORS = frozenset("cup cap setminus".split())  # between sets (intervals), never between numbers
SPACING_COMMANDS = frozenset(
    (
        "quad qquad thinspace medspace thickspace enspace enskip negthinspace negmedspace negthickspace "
        "displaystyle textstyle scriptstyle scriptscriptstyle left right big Big bigg Bigg bigl bigr Bigl Bigr "
        "biggl biggr Biggl Biggr middle"
    ).split()
)
SPACING_WITH_ARGUMENT = frozenset("hspace vspace phantom hphantom vphantom mspace".split())
TRANSPARENT_COMMANDS = frozenset(
    (
        "text textrm textit textbf textsf texttt textup textnormal mbox mathrm mathit mathbf mathsf mathtt mathbb "
        "mathcal mathfrak mathnormal boldsymbol bm"
    ).split()
)
FRACTIONS = frozenset("frac dfrac tfrac cfrac".split())
_DELIMITER_SIZES = frozenset("left right big Big bigg Bigg bigl bigr Bigl Bigr biggl biggr Biggl Biggr middle".split())

_COMMAND = re.compile(r"\\([A-Za-z]+)\*?|\\(.)", re.DOTALL)
_NUMBER = re.compile(r"\d+(?:\.\d+)?|\.\d+")
_SPACE_SYMBOLS = {",", ";", ":", "!", ">", " ", "$"}
_INTEGER = re.compile(r"\s*\{?\s*(\d+)\s*\}?\s*")


@dataclass(frozen=True)
class Token:
    kind: str  # see the module doc
    start: int
    end: int


def _group_end(text: str, i: int) -> int:
    """The position after the brace group that opens at text[i] ("{"), or len(text) when it never closes."""
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return j + 1
    return len(text)


def _skip_spaces(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _argument_end(text: str, i: int) -> int:
    """The end of one argument from text[i]: a brace group, a command, or one character (as TeX reads `\\frac12`)."""
    i = _skip_spaces(text, i)
    if i >= len(text):
        return i
    if text[i] == "{":
        return _group_end(text, i)
    m = _COMMAND.match(text, i)
    return m.end() if m else i + 1


def _groups_end(text: str, i: int) -> int:
    """The end of the optional `[...]` and brace groups that follow a command at text[i]."""
    j = _skip_spaces(text, i)
    if j < len(text) and text[j] == "[":
        close = text.find("]", j)
        j = _skip_spaces(text, close + 1) if close >= 0 else j
    end = i
    while j < len(text) and text[j] == "{":
        end = j = _group_end(text, j)
        j = _skip_spaces(text, j)
    return end


def scan(text: str) -> list[Token]:
    """The answer `text` as tokens (see the module doc); S tokens included."""
    tokens: list[Token] = []
    environments = 0
    i = 0
    while i < len(text):
        char = text[i]
        if char in "^_":
            i = _argument_end(text, i + 1)  # the script belongs to the value before it
            continue
        if char == "\\":
            end, kind, environments = _command(text, i, environments)
            if kind:
                tokens.append(Token(kind, i, end))
            i = end
            continue
        if m := _NUMBER.match(text, i):
            tokens.append(Token("N", i, m.end()))
            i = m.end()
            continue
        kind = _char_kind(char, environments)
        tokens.append(Token(kind, i, i + 1))
        i += 1
    return tokens


def _char_kind(char: str, environments: int) -> str:
    if char.isspace() or char in "~{}":
        return "S"
    if char in "([":
        return "("
    if char in ")]":
        return ")"
    if char in "!%":
        return char
    if char in "&|":
        return "O" if environments and char == "&" else "C"
    return "L" if char.isalpha() else "O"


def _command(text: str, i: int, environments: int) -> tuple[int, str, int]:
    """(position after the command at text[i] and what it consumes, its kind or "" for none, environments)."""
    m = _COMMAND.match(text, i)
    if m is None:  # a lone backslash at the end
        return i + 1, "C", environments
    name, symbol = m.group(1), m.group(2)
    end = m.end()
    if symbol is not None:
        if symbol in _SPACE_SYMBOLS:
            return end, "S", environments
        if symbol in "{[(":
            return end, "(", environments
        if symbol in "}])":
            return end, ")", environments
        if symbol == "%":
            return end, "%", environments
        if symbol == "\\":
            return end, "O" if environments else "C", environments
        return end, "C" if symbol == "|" else "O", environments
    if name in ("begin", "end"):
        return _groups_end(text, end), "", environments + (1 if name == "begin" else -1)
    if name in TRANSPARENT_COMMANDS:
        return end, "", environments  # its braces are read as grouping (S), its content as any other
    if name in SPACING_WITH_ARGUMENT:
        return _groups_end(text, end), "S", environments
    if name in SPACING_COMMANDS:
        after = _skip_spaces(text, end)
        if name in _DELIMITER_SIZES and after < len(text) and text[after] == ".":
            end = after + 1  # \left. and \right.: no delimiter
        return end, "S", environments
    if name in FRACTIONS:
        first = _argument_end(text, end)
        second = _argument_end(text, first)
        return second, "M" if _proper(text[end:first], text[first:second]) else "A", environments
    if name == "sqrt" and _skip_spaces(text, end) < len(text) and text[_skip_spaces(text, end)] not in "{[":
        return _argument_end(text, end), "A", environments  # \sqrt 3
    if name in VALUE_COMMANDS:
        return end, "L", environments
    if name in OPERATOR_COMMANDS:
        return end, "O", environments
    if name in SET_OPERATORS:
        return end, "U", environments
    groups = _groups_end(text, end)
    return (groups, "A", environments) if groups > end else (end, "C", environments)


def _proper(numerator: str, denominator: str) -> bool:
    """Whether two fraction arguments are integer literals p < q: the fraction part of a mixed number."""
    p, q = _INTEGER.fullmatch(numerator), _INTEGER.fullmatch(denominator)
    return bool(p and q) and 0 < int(p.group(1)) < int(q.group(1))


_VALUE_END = "N)AM!%"
_RULES = (
    (re.compile(rf"[{_VALUE_END}][SC]*N"), "a number right after another value"),
    (re.compile(rf"[{_VALUE_END}][SC]*C[SC]*[NAML(]"), "values joined by something other than an operator"),
    (re.compile(rf"[{_VALUE_END}]S*\(S*O?S*NS*\)"), "a value next to a parenthesized number"),
    (re.compile(r"[N!%]S*US*N"), "a set operation between numbers"),
)


def joined_values(text: str) -> str | None:
    """Why the answer `text` holds two values joined by nothing that makes one value of them, or None."""
    kinds = "".join(t.kind for t in scan(text))
    return next((why for rule, why in _RULES if rule.search(kinds)), None)


def explicit_products(text: str) -> str | None:
    """`text` with `\\cdot` before every command value that stands right after another value (a mixed number's
    fraction excepted: an integer, then M); None when there is none."""
    tokens = [t for t in scan(text) if t.kind != "S"]
    cuts = [
        right.start
        for left, right in zip(tokens, tokens[1:], strict=False)
        if left.kind in _VALUE_END
        and right.kind in "AM"
        and not (left.kind == "N" and right.kind == "M" and "." not in text[left.start : left.end])
    ]
    if not cuts:
        return None
    pieces, last = [], 0
    for cut in cuts:
        pieces += [text[last:cut], " \\cdot "]
        last = cut
    return "".join(pieces) + text[last:]

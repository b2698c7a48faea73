"""Completion text: the trainer passes completions as plain strings or as chat-message lists.

TRL's `GRPOTrainer` gives conversational completions as `[{"role": "assistant", "content": ...}]`;
`content` may itself be a list of parts (`[{"type": "text", "text": ...}]`). Reward functions read
the assistant text through `completion_text`, so every reward accepts both forms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def completion_text(completion: Any) -> str:
    """The text of one completion: a string as is; a message list's assistant contents joined by newlines."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content", ""))
    if isinstance(completion, Sequence):
        messages = [m for m in completion if isinstance(m, dict)]
        if len(messages) != len(completion):
            raise TypeError(f"completion: expected a string or a list of message dicts, got {completion!r:.200}")
        assistant = [m for m in messages if m.get("role", "assistant") == "assistant"]
        return "\n".join(_content_text(m.get("content", "")) for m in assistant)
    raise TypeError(f"completion: expected a string or a list of message dicts, got {type(completion).__name__}")


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    raise TypeError(f"message content: expected a string or a list of parts, got {type(content).__name__}")


def completion_texts(completions: Sequence[Any]) -> list[str]:
    """`completion_text` of each completion."""
    return [completion_text(c) for c in completions]


def broadcast_column(name: str, values: Any, n: int) -> list[Any]:
    """A per-completion column of length `n`: a list of length n as is, a scalar (str, number, None,
    dict) repeated. A list of another length is an error naming the column."""
    if isinstance(values, (list, tuple)):
        if len(values) != n:
            raise ValueError(f"column {name!r}: {len(values)} values for {n} completions")
        return list(values)
    return [values] * n

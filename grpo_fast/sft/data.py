"""SFT datasets in TRL's column conventions, tokenised to (input_ids, loss_mask) per example.

Conventions (`data.format`, "auto" tries them in this order):
- prompt_completion: `prompt` + `completion` columns (names configurable). Strings: the prompt is encoded
  exactly as the GRPO run encodes it (PromptEncoder: through the chat template when data.use_chat_template
  says so), the completion is tokenised on its own and followed by EOS, so SFT trains the tokens a rollout
  would generate after that prompt. Chat messages (a completion that is a list of assistant messages, as the
  rejection sampler writes for chat prompts): the completion is what the chat template renders after the
  prompt's generation prompt, end-of-turn tokens included.
- messages: a conversation; the loss covers every assistant turn (each turn's tokens after the generation
  prompt that precedes it, end-of-turn included).
A chat row may carry a `tools` column (TRL's): the JSON schemas of the tools its conversation calls, rendered by
the chat template as a rollout with those tools renders them. Tool turns (role "tool") are context, never targets.
- text: language modelling, the loss covers every token but the first (EOS appended).
Other columns are ignored.

Truncation keeps the first `max_length` tokens (the prompt and the start of the completion; a truncated
completion loses its EOS). Examples left without a loss token (a prompt filling max_length, a conversation
without an assistant turn) are skipped and counted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from grpo_fast.data.loading import load_table
from grpo_fast.rollout.prompts import PromptEncoder

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTExample:
    """input_ids: int64 [L]; loss_mask: bool [L], True where token t is a target (predicted from the tokens
    before it): loss_mask[0] is always False."""

    input_ids: np.ndarray
    loss_mask: np.ndarray

    def __len__(self) -> int:
        return len(self.input_ids)


def load_sft_rows(source, split: str = "train") -> list[dict]:
    """Rows of `source`: a list of dicts, a `datasets.Dataset`, or what grpo_fast.data.loading.load_table
    reads (a local .jsonl/.parquet/.csv, a hub name)."""
    if isinstance(source, list):
        return source
    if hasattr(source, "to_list"):
        return source.to_list()
    if not source:
        raise ValueError("data.source: required (a .jsonl/.parquet/.csv file or a hub dataset name)")

    return load_table(source, split).to_list()


def detect_format(columns, data) -> str:
    """The convention of a dataset with `columns` under data.format / prompt_column / completion_column."""
    if data.format != "auto":
        needed = {
            "prompt_completion": (data.prompt_column, data.completion_column),
            "messages": ("messages",),
            "text": ("text",),
        }[data.format]
        missing = [c for c in needed if c not in columns]
        if missing:
            raise ValueError(f"data.format: {data.format} needs column(s) {missing}; the dataset has {sorted(columns)}")
        return data.format
    if data.prompt_column in columns and data.completion_column in columns:
        return "prompt_completion"
    if "messages" in columns:
        return "messages"
    if "text" in columns:
        return "text"
    raise ValueError(
        f"data.format: cannot tell the dataset's convention from its columns {sorted(columns)}: expected "
        f"{data.prompt_column!r} + {data.completion_column!r}, 'messages', or 'text'"
    )


class ExampleEncoder:
    """Turns rows of one convention into SFTExamples (see the module docstring). data: the SFT config's
    `data` section (format, columns, use_chat_template, system_prompt, max_length, add_eos)."""

    def __init__(self, tokenizer, data) -> None:
        self.tokenizer, self.data = tokenizer, data
        self.prompts = PromptEncoder(tokenizer, data)
        self.eos = [tokenizer.eos_token_id] if data.add_eos and tokenizer.eos_token_id is not None else []

    def __call__(self, row: dict, fmt: str) -> tuple[list[int], list[bool]]:
        """(input_ids, loss_mask) of one row, before truncation."""
        if fmt == "text":
            ids = self._with_eos(self.tokenizer(row["text"])["input_ids"])
            return ids, [t > 0 for t in range(len(ids))]
        tools = row.get("tools") or None
        if fmt == "messages":
            return self._conversation(row["messages"], tools)
        prompt, completion = row[self.data.prompt_column], row[self.data.completion_column]
        if isinstance(completion, list):  # chat messages: the prompt is a conversation too
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            return self._conversation(messages + completion, tools)
        prompt_ids = self.prompts.encode(prompt)
        completion_ids = self._with_eos(self.tokenizer(completion, add_special_tokens=False)["input_ids"])
        return prompt_ids + completion_ids, [False] * len(prompt_ids) + [True] * len(completion_ids)

    def _conversation(self, messages: list[dict], tools: list | None = None) -> tuple[list[int], list[bool]]:
        """Loss on each assistant turn: the tokens between the generation prompt before it (the prompt
        encoding of the turns so far) and the end of its own rendering."""
        full = self._render(self._with_system(messages), tools)
        mask = [False] * len(full)
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            if i == 0:
                raise ValueError("a conversation starts with an assistant turn (no prompt to condition it on)")
            prompt_ids = self.prompts.encode(messages[:i], tools)
            turn = self._render(self._with_system(messages[: i + 1]), tools)
            start, end = len(prompt_ids), len(prompt_ids) + len(self._after(prompt_ids, turn))
            self._after(turn, full)  # the conversation up to this turn is how the whole one begins
            mask[start:end] = [True] * (end - start)
        return full, mask

    def _with_system(self, messages: list[dict]) -> list[dict]:
        if self.data.system_prompt and (not messages or messages[0].get("role") != "system"):
            return [{"role": "system", "content": self.data.system_prompt}, *messages]
        return messages

    def _render(self, messages: list[dict], tools: list | None = None) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def _with_eos(self, ids: list[int]) -> list[int]:
        """ids followed by EOS (with data.add_eos, unless they already end with it)."""
        if self.eos and not (ids and ids[-1] == self.eos[0]):
            return ids + self.eos
        return ids

    @staticmethod
    def _after(prefix: list[int], full: list[int]) -> list[int]:
        """full's tokens after `prefix`, which must begin it."""
        if full[: len(prefix)] != prefix:
            raise ValueError(
                "the chat template does not render a conversation's beginning as a prefix of the whole "
                "conversation (e.g. it rewrites earlier turns), so the completion tokens cannot be located"
            )
        return full[len(prefix) :]


def tokenize_rows(rows: list[dict], tokenizer, data) -> tuple[list[SFTExample], dict]:
    """SFTExamples of `rows` (skipping those without a loss token) and counts: rows, examples, format,
    truncated, skipped_no_loss, tokens, loss_tokens."""
    if not rows:
        raise ValueError("data.source: the dataset is empty")
    fmt = detect_format(rows[0].keys(), data)
    encode = ExampleEncoder(tokenizer, data)
    examples, truncated, skipped = [], 0, 0
    for index, row in enumerate(rows):
        try:
            ids, mask = encode(row, fmt)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"data.source: row {index} ({fmt}): {type(exc).__name__}: {exc}") from None
        if data.max_length is not None and len(ids) > data.max_length:
            ids, mask, truncated = ids[: data.max_length], mask[: data.max_length], truncated + 1
        if not any(mask):
            skipped += 1
            continue
        examples.append(SFTExample(np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=bool)))
    stats = {
        "rows": len(rows),
        "examples": len(examples),
        "format": fmt,
        "truncated": truncated,
        "skipped_no_loss": skipped,
        "tokens": sum(len(e) for e in examples),
        "loss_tokens": int(sum(e.loss_mask.sum() for e in examples)),
    }
    if skipped:
        logger.warning("sft data: skipped %d of %d rows with no loss token (after truncation)", skipped, len(rows))
    logger.info("sft data: %s", stats)
    if not examples:
        raise ValueError(f"data.source: no row has a loss token ({stats})")
    return examples, stats

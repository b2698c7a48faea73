"""From dataset prompts to what an engine is asked: prompt token ids (chat template or plain text), the stop
tokens, and the run's sampling settings."""

from __future__ import annotations

from grpo_fast.rollout.base import SamplingSpec
from grpo_fast.rollout.chat_turns import render_chat


class PromptEncoder:
    """Token ids of prompts: chat messages (or a string wrapped as a user turn) through the tokenizer's chat
    template when it has one (data.use_chat_template), plain strings as they are; training prompts cached.

    The template renders with data.chat_template_kwargs (TRL's chat_template_kwargs, e.g. enable_thinking); a run
    with tools sets `chat_template` to the prefix-preserving template TRL swaps in (grpo_fast.rollout.chat_turns),
    in place of the tokenizer's own, for every prompt as TRL renders them."""

    def __init__(self, tokenizer, data_config, max_tokens: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.data = data_config
        self.max_tokens = max_tokens  # longest prompt the engine can complete (ValueError naming the row beyond)
        self.chat_template: str | None = None
        self.template_kwargs: dict = dict(getattr(data_config, "chat_template_kwargs", None) or {})
        self._cache: dict[int, list[int]] = {}

    def _use_chat_template(self) -> bool:
        mode = self.data.use_chat_template  # True, False or "auto"
        has = self.chat_template is not None or getattr(self.tokenizer, "chat_template", None) is not None
        return has if mode == "auto" else mode

    def render(self, messages: list[dict], *, generation_prompt: bool, tools=None) -> list[int]:
        """The ids of `messages` through the run's chat template, with its keyword arguments."""
        return render_chat(self.tokenizer, messages, self.chat_template, self.template_kwargs, generation_prompt, tools)

    def messages(self, prompt) -> list[dict]:
        """The chat messages of a prompt: its messages (a string as one user turn), after the system prompt."""
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        if self.data.system_prompt and messages[0].get("role") != "system":
            messages = [{"role": "system", "content": self.data.system_prompt}, *messages]
        return messages

    def encode(self, prompt, tools: list | None = None) -> list[int]:
        """The prompt's ids (with the generation prompt); `tools`: JSON schemas the chat template renders."""
        if isinstance(prompt, list) or self._use_chat_template():
            return self.render(self.messages(prompt), generation_prompt=True, tools=tools)
        return self.tokenizer(prompt, add_special_tokens=True)["input_ids"]

    def encode_rows(self, rows: list[dict], index: list[int], cache: bool) -> list[list[int]]:
        """Token ids of rows[i]["prompt"] for i in index; `cache` keeps them by row index."""
        return [self.row_ids(rows[i], i if cache else None, i) for i in index]

    def row_ids(self, row: dict, key: int | None = None, label: int | str | None = None) -> list[int]:
        """Token ids of row["prompt"], kept under `key` when one is given; ValueError naming the row (`label`,
        default `key`) when the prompt leaves the engine no room."""
        if key is not None and key in self._cache:
            return self._cache[key]
        ids = self.checked(label if label is not None else key, self.encode(row["prompt"]))
        if key is not None:
            self._cache[key] = ids
        return ids

    def checked(self, row: int | str | None, ids: list[int]) -> list[int]:
        if self.max_tokens is not None and len(ids) > self.max_tokens:
            raise ValueError(
                f"dataset row {row}: the prompt is {len(ids)} tokens, more than the {self.max_tokens} that "
                "rollout.max_model_len minus rollout.max_completion_length leaves; shorten or drop the row, or "
                "raise rollout.max_model_len"
            )
        return ids


def training_sampling(
    rollout, stop_ids: tuple[int, ...], n: int, seed: int, max_tokens: int | None = None
) -> SamplingSpec:
    """The run's sampling settings (its `rollout` config section) for n completions per prompt, of at most
    `max_tokens` tokens (default rollout.max_completion_length)."""
    r = rollout
    return SamplingSpec(
        n=n,
        max_tokens=r.max_completion_length if max_tokens is None else max_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        stop_token_ids=stop_ids,
        seed=seed,
    )


def stop_token_ids(tokenizer, stop: list[str]) -> tuple[int, ...]:
    """EOS and the single-token stop strings of rollout.stop."""
    ids = {tokenizer.eos_token_id} - {None}
    for s in stop:
        toks = tokenizer.encode(s, add_special_tokens=False)
        if len(toks) != 1:
            raise ValueError(f"rollout.stop: {s!r} is not a single token for this tokenizer")
        ids.add(toks[0])
    return tuple(sorted(ids))

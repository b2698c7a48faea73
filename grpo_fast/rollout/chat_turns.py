"""The chat template's side of multi-turn rollouts, in token ids: the tokens that carry tool results into the
sequence, and the parse of a sampled turn into an assistant message with its tool calls.

Token accounting is by concatenation, never by re-tokenising text: a rollout's sequence is the prompt's ids, then
each turn's sampled ids exactly as the engine returned them, then the ids of the tool-result block
(`tool_suffix_ids`), which the template renders for the tool messages and closes with the next assistant header.
Re-tokenising the conversation could merge or split tokens at the turn boundaries, so the trainer would score
tokens the engine never sampled; concatenation makes that impossible by construction.

`tool_suffix_ids` renders a one-call conversation with and without the tool messages and keeps the difference,
cut at the prefix's last end-of-turn token: the sampled turn ends with that token (the engine stops on it), and
templates that write a newline after it put the newline in the suffix. That needs a prefix-preserving template
(earlier messages render the same whatever follows); `ChatFormat` checks it, and that the template renders a tool
call and a tool result at all, when it is built.

Parsing uses transformers' response parsing (`tokenizer.parse_response`, driven by the tokenizer's declarative
`response_template`), the tokenizer's own convention for its tool calls.

What TRL's GRPOTrainer does to the tokenizer of a run with tools, `prepare_tool_template` does the same way, with
TRL's own functions: a tokenizer without a response template gets the one TRL knows for its chat template
(`add_response_schema`), and a chat template that is not prefix-preserving by TRL's test is replaced, for every
rendering of the run, with TRL's training template for it (`get_training_chat_template`). Every rendering passes
the run's chat_template_kwargs, as TRL passes them.
"""

from __future__ import annotations

from collections.abc import Sequence

_SENTINELS = ("toolname_q7", "argkey_q7", "argvalue_q7", "toolresult_q7")


def render_chat(
    tokenizer,
    messages: list[dict],
    chat_template: str | None,
    template_kwargs: dict,
    generation_prompt: bool,
    tools=None,
    tokenize: bool = True,
):
    """`messages` through `chat_template` (the tokenizer's own when None) with the run's `template_kwargs`: the
    ids (a list, whatever container the tokenizer returns them in), or the text when not `tokenize`."""
    out = tokenizer.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=generation_prompt,
        tokenize=tokenize,
        chat_template=chat_template,
        **template_kwargs,
    )
    if not tokenize:
        return out
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def prepare_tool_template(tokenizer) -> str | None:
    """TRL's preparation of a tool run's tokenizer (see module doc): sets its response template when it has none
    and TRL knows one for its chat template; returns TRL's prefix-preserving training template when its own chat
    template is not prefix-preserving (None when it is). TRL is imported only for a step that needs it. Without
    TRL, or for a template TRL does not know, the tokenizer is left as it is and ChatFormat's checks decide (its
    prefix check stops at the end-of-turn token, where the tool-result ids are cut, as TRL cuts them)."""
    if getattr(tokenizer, "chat_template", None) is None:
        return None  # ChatFormat names what is missing
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            from trl.chat_template_utils import add_response_schema

            add_response_schema(tokenizer)
        except (ImportError, ValueError):  # no TRL, or a template it does not know: ChatFormat asks for one
            pass
    try:
        if is_prefix_preserving(tokenizer):
            return None
        from trl.chat_template_utils import get_training_chat_template

        return get_training_chat_template(tokenizer)
    except Exception:  # noqa: BLE001 - no tool rendering, no TRL, no training template for it: ChatFormat decides
        return None


def is_prefix_preserving(tokenizer) -> bool:
    """TRL's test (trl.chat_template_utils.is_chat_template_prefix_preserving, text models): a one-call
    conversation renders as the start of the same conversation with a tool result and the next assistant header."""
    call = [{"type": "function", "function": {"name": "dummy", "arguments": {}}}]
    turn = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": call}]
    before = tokenizer.apply_chat_template(turn, tokenize=True, return_dict=False)
    after = tokenizer.apply_chat_template(
        [*turn, {"role": "tool", "name": "dummy", "content": "dummy"}],
        tokenize=True,
        return_dict=False,
        add_generation_prompt=True,
    )
    return list(after[: len(before)]) == list(before)


class ChatFormat:
    """A tokenizer's chat template as multi-turn rollouts need it (see module doc), rendered with `chat_template`
    in place of the tokenizer's own when given and with `template_kwargs`; ValueError at construction naming what
    the template lacks."""

    def __init__(
        self,
        tokenizer,
        end_of_turn_id: int | None = None,
        *,
        chat_template: str | None = None,
        template_kwargs: dict | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn_id = tokenizer.eos_token_id if end_of_turn_id is None else end_of_turn_id
        self.chat_template, self.template_kwargs = chat_template, dict(template_kwargs or {})
        if chat_template is None and getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("tools need a tokenizer with a chat template that renders tool calls; this one has none")
        if getattr(tokenizer, "response_template", None) is None:
            raise ValueError(
                "tools need the tokenizer's response_template (transformers' response parsing) to read tool calls "
                "from the model's turns; set tokenizer.response_template for its chat template (TRL's "
                "trl.chat_template_utils.add_response_schema sets it for known templates)"
            )
        name, key, value, result = _SENTINELS
        call = [{"type": "function", "function": {"name": name, "arguments": {key: value}}}]
        rendered = self._render(
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": call},
                {"role": "tool", "name": name, "content": result},
            ],
            tokenize=False,
        )
        if not all(s in rendered for s in _SENTINELS):
            raise ValueError(
                "the tokenizer's chat template does not render a tool call and its result (a user -> assistant with "
                "tool_calls -> tool conversation lost its tool name, arguments or result)"
            )
        before = self._dummy_prefix(name)
        after = self._render([*self._dummy(name), {"role": "tool", "name": name, "content": result}], True)
        if after[: len(before)] != before:
            raise ValueError(
                "the tokenizer's chat template is not prefix-preserving (an assistant turn renders differently once "
                "a tool result follows it), so tool results cannot be appended as token ids"
            )

    def prompt_ids(self, messages: list[dict], tools: Sequence[dict]) -> list[int]:
        """The prompt's ids with the generation prompt, the tools' schemas rendered by the template."""
        return self._render(messages, True, tools=list(tools) or None)

    def tool_suffix_ids(self, tool_messages: list[dict]) -> list[int]:
        """The ids that follow a sampled turn ending in the end-of-turn token: the tool messages' block and the next
        assistant header."""
        prefix = self._dummy_prefix(tool_messages[0]["name"])
        full = self._render([*self._dummy(tool_messages[0]["name"]), *tool_messages], True)
        return full[len(prefix) :]

    def parse(self, turn_ids: list[int], context_ids: list[int], tools: Sequence[dict]) -> dict | None:
        """The assistant message of a sampled turn (`context_ids`: everything before it), with "tool_calls" when it
        makes any; None when the parser rejects the turn (a malformed tool call)."""
        try:
            message = self.tokenizer.parse_response(turn_ids, prefix=context_ids, tools=list(tools) or None)
        except (ValueError, TypeError, KeyError):
            return None
        if not isinstance(message, dict):
            return None
        content = message.get("content")
        eos = self.tokenizer.decode([self.end_of_turn_id])
        message["content"] = content.removesuffix(eos) if isinstance(content, str) else ""
        return message

    def _dummy(self, name: str) -> list[dict]:
        call = [{"type": "function", "function": {"name": name, "arguments": {}}}]
        return [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": call}]

    def _dummy_prefix(self, name: str) -> list[int]:
        """The one-call conversation's ids, cut after its last end-of-turn token."""
        ids = self._render(self._dummy(name), False)
        ends = [i for i, t in enumerate(ids) if t == self.end_of_turn_id]
        return ids[: ends[-1] + 1] if ends else ids

    def _render(self, messages: list[dict], generation_prompt: bool = False, tokenize: bool = True, tools=None):
        return render_chat(
            self.tokenizer, messages, self.chat_template, self.template_kwargs, generation_prompt, tools, tokenize
        )

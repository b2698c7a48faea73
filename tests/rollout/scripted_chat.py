"""A byte-level BPE chat tokenizer trained locally, with a ChatML chat template that renders tools, and an engine
that writes each assistant turn from a script: the tool-semantics tests drive real multi-turn rollouts (real
template, real response parsing, real tool calls, ids concatenated turn by turn) with turns they choose.

`ScriptedTurns` is the only stand-in: it replaces sampling, nothing else. Turn k of a rollout whose user message
is `u` is `script[u][k]`, tokenised with the real tokenizer and ended with the end-of-turn token."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec
from grpo_fast.rollout.chat_turns import ChatFormat
from grpo_fast.rollout.environments import Environments
from grpo_fast.rollout.multi_turn import MultiTurn
from grpo_fast.rollout.prompts import PromptEncoder
from grpo_fast.rollout.tools import Tool
from grpo_fast.trainer.config import DataConfig

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
QWEN3_SPECIAL = [*SPECIAL, "<think>", "</think>", "<tool_response>", "</tool_response>"]
CHATML_TOOLS = (
    "{%- if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def build_bpe_chat_tokenizer(
    corpus: list[str], vocab_size: int = 600, special: list[str] = SPECIAL
) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on `corpus`, `special` tokens (the first the padding token), <|im_end|> as EOS; no
    chat template set."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token=special[0], additional_special_tokens=special[1:]
    )
    fast.padding_side = "left"
    return fast


def chatml_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """The BPE tokenizer with CHATML_TOOLS and its response template, trained on text around `words`."""
    corpus = [*words, json.dumps({"name": "tool", "arguments": {"amount": 12, "seconds": 0.5}}), "error: timed out"]
    tok = build_bpe_chat_tokenizer(corpus * 4, vocab_size=400)
    tok.chat_template = CHATML_TOOLS
    tok.response_template = RESPONSE_TEMPLATE
    return tok


def qwen3_template() -> str:
    """Qwen3's chat template, as TRL ships it (one that TRL's add_response_schema and get_training_chat_template
    know), read from TRL's package without importing it."""
    root = Path(importlib.util.find_spec("trl").submodule_search_locations[0])
    return (root / "chat_templates" / "qwen3.jinja").read_text()


def tool_call(name: str, **arguments) -> str:
    """The text of one tool call in CHATML_TOOLS's format."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class ScriptedTurns(RolloutEngine):
    """Writes turn k of a rollout whose user message is u as script[u][k] (see module doc); `before_generate`,
    when set, runs at the start of every generate call (a test's hook between resets and rewards)."""

    name = "scripted_turns"

    def __init__(self, tokenizer, script: dict[str, list[str]]) -> None:
        self.tokenizer, self.script = tokenizer, script
        self.before_generate: Callable[[], None] | None = None

    @classmethod
    def from_config(cls, config, *, options, model, tokenizer, export_model):
        raise NotImplementedError("built by the test")

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingSpec) -> list[list[Completion]]:
        if self.before_generate is not None:
            self.before_generate()
        return [[self._turn(ids) for _ in range(sampling.n)] for ids in prompt_token_ids]

    def _turn(self, context: list[int]) -> Completion:
        text = self.tokenizer.decode(context)
        user = text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        turn = text.count("<|im_start|>assistant\n") - 1
        ids = [*self.tokenizer(self.script[user][turn], add_special_tokens=False)["input_ids"]]
        ids.append(self.tokenizer.eos_token_id)
        return Completion(ids, [-1.0] * len(ids), self.tokenizer.decode(ids, skip_special_tokens=True))

    def load_weights(self, weights):
        return {}


def multi_turn(tok, tools: list[Callable] = (), environment: type | None = None, **limits) -> MultiTurn:
    """MultiTurn rollouts in `tok`'s chat format over the functions `tools` and the environment class
    `environment` (or none); `limits`: MultiTurn's keywords (max_iterations, max_model_len, timeout, workers...)."""
    environments = None if environment is None else Environments.of(environment)
    return MultiTurn(
        PromptEncoder(tok, DataConfig()), ChatFormat(tok), [Tool.of(fn) for fn in tools], environments, **limits
    )

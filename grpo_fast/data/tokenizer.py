"""Loading a model's tokenizer as it was saved.

transformers 5 picks the tokenizer class from the model type for some architectures even when the
directory's tokenizer_config.json names a generic one: a Qwen2 directory holding a plain `tokenizers`
tokenizer (saved as "TokenizersBackend" / "PreTrainedTokenizerFast", e.g. the demo's character
tokenizer) comes back as a byte-level Qwen2Tokenizer that drops spaces. `load_tokenizer` keeps the
saved class in that case; every other directory loads exactly as `AutoTokenizer` loads it.
"""

from __future__ import annotations

import json
from pathlib import Path

_GENERIC = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: str):
    """The tokenizer of `path` (a local directory or a hub name), with a pad token (eos when it has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    config = Path(path) / "tokenizer_config.json"
    if config.is_file():
        saved = json.loads(config.read_text()).get("tokenizer_class")
        if saved in _GENERIC and type(tokenizer).__name__ not in _GENERIC:
            from transformers import PreTrainedTokenizerFast

            tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer

"""Fixtures of the SFT tests: the demo's character tokenizer (with and without a chat template) and a tiny
Qwen2 model built from a seed."""

import pytest

from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model

# Renders "u:hi a:yo</s> " ("a:" is the generation prompt); every assistant turn ends with EOS.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %} {% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


@pytest.fixture
def tok():
    return build_char_tokenizer()


@pytest.fixture
def chat_tok():
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture
def model(tok):
    return build_tiny_model(tok, seed=0)

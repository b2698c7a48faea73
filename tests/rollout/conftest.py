"""The multi-turn tests' agents (tool_agent.py), each trained once per session."""

from __future__ import annotations

import pytest
from tool_agent import train_agent

from grpo_fast.core.tiny_models import build_byte_bpe_tokenizer


@pytest.fixture(scope="session")
def tool_agent(tmp_path_factory):
    """(model, tokenizer, directory) of the agent that replays tool_agent.SCRIPTS under greedy decoding; tests that
    train load their own copy from the directory."""
    return train_agent(tmp_path_factory.mktemp("tool_agent") / "model")


@pytest.fixture(scope="session")
def bpe_tool_agent(tmp_path_factory):
    """The agent with a byte-level BPE chat tokenizer (tokens that join characters), for the tests that join turns
    and rounds."""
    return train_agent(
        tmp_path_factory.mktemp("bpe_tool_agent") / "model", tokenizer=build_byte_bpe_tokenizer(chat=True)
    )

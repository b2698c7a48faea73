"""The multi-turn tests' agent (tool_agent.py), trained once per session."""

from __future__ import annotations

import pytest
from tool_agent import train_agent


@pytest.fixture(scope="session")
def tool_agent(tmp_path_factory):
    """(model, tokenizer, directory) of the agent that replays tool_agent.SCRIPTS under greedy decoding; tests that
    train load their own copy from the directory."""
    return train_agent(tmp_path_factory.mktemp("tool_agent") / "model")

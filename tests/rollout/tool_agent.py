"""The multi-turn tests' agent: a tiny chat model SFT-trained on a few scripted tool-calling conversations until
greedy decoding replays them, so that a rollout makes known tool calls with a real model and a real engine.

The tools and the environment are written the way TRL's documentation writes them (type hints, Google-style
docstrings, an async tool, a tool that raises, one that outlasts its timeout, an environment with state and a
reward), and the conversations' tool results are what the tools really return.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import torch

from grpo_fast.core.tiny_models import DEFAULT_CHARS, TinyModelSpec, build_chat_tokenizer, build_tiny_model, save_tiny
from grpo_fast.rollout.builtin_tools import multiply
from grpo_fast.rollout.environments import environment_tools
from grpo_fast.rollout.tools import Tool, ToolRunner
from grpo_fast.sft.in_memory import sft_train

SLOW_TIMEOUT = 0.5
TEXT_CHARS = "_ABCDEFGHIJKLMNOPQRSTUVWXYZ.'\"[]{}<>|!;#&"  # what the tools' error results spell


async def lookup(key: str) -> str:
    """Looks a key up in a small table.

    Args:
        key: The key to look up.
    """
    await asyncio.sleep(0.01)
    return {"k": "v"}.get(key, "none")


def explode() -> str:
    """A tool that always fails."""
    raise RuntimeError("the tool broke")


def slow(seconds: float) -> str:
    """Waits, then answers.

    Args:
        seconds: How long to wait.
    """
    time.sleep(seconds)
    return "done"


class CounterEnv:
    """A stateful environment: a counter the model increments; its reward is 1 when the counter ends at 3."""

    def __init__(self) -> None:
        self.value = 0

    def reset(self, **row) -> str:
        self.value = 0
        return f" (start {self.value})"

    def increment(self, step: int) -> str:
        """Adds to the counter and returns its new value.

        Args:
            step: How much to add.
        """
        self.value += step
        return str(self.value)

    def get_reward(self) -> float:
        return float(self.value == 3)


TOOLS = (multiply, lookup, explode, slow)


def call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


SCRIPTS = {
    # prompt -> the tool calls of each of its turns, then the answer
    "m": ([call("multiply", a=12, b=34)], "408"),
    "c": ([call("increment", step=1)], [call("increment", step=2)], "3"),
    "a": ([call("lookup", key="k")], "v"),
    "x": ([call("explode")], "no"),
    "s": ([call("slow", seconds=5)], "late"),
    "u": ([call("nosuch")], "no"),
    "b": ([call("multiply", a=12)], "no"),
    "t": ("hi",),
}
ENVIRONMENT_ONLY = ("c",)


def tools_of(environment: object | None) -> list[Tool]:
    """A rollout's tools: the plain tools, then the environment's methods (the order its prompt renders them)."""
    return [Tool.of(fn) for fn in TOOLS] + (environment_tools(environment) if environment is not None else [])


def conversation(script: tuple, environment: object | None) -> list[dict]:
    """The script's conversation, each call's result what the tool really returns (run here)."""
    runner, tools = ToolRunner(SLOW_TIMEOUT), {t.name: t for t in tools_of(environment)}
    messages = []
    for step in script:
        if isinstance(step, str):
            return [*messages, {"role": "assistant", "content": step}]
        messages.append({"role": "assistant", "content": "", "tool_calls": step})
        for c in step:
            result = runner.call(tools, c)
            messages.append({"role": "tool", "name": result.name, "content": result.text})
    return messages


AGENT_SPEC = TinyModelSpec(
    hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128, max_position_embeddings=256
)
"""Half the demo model's width (vLLM's CPU attention needs head_dim >= 32): memorising the scripts needs no more."""


def train_agent(out_dir, steps: int = 250, lr: float = 5e-3, tokenizer=None):
    """(model, tokenizer, path) of the agent, trained on SCRIPTS without and with the environment (whose reset
    appends " (start 0)" to the prompt); `tokenizer`: a chat tokenizer (default: characters)."""
    torch.manual_seed(0)
    tok = tokenizer or build_chat_tokenizer(DEFAULT_CHARS + TEXT_CHARS)
    model = build_tiny_model(tok, AGENT_SPEC, seed=0)
    pairs = []
    for with_env in (False, True):
        for prompt, script in SCRIPTS.items():
            if prompt in ENVIRONMENT_ONLY and not with_env:
                continue
            env = CounterEnv() if with_env else None
            observation = env.reset() if env is not None else ""
            schemas = [t.schema for t in tools_of(env)]
            pairs.append((prompt + observation, conversation(script, env), schemas))
    sft_train(model, tok, pairs, steps=steps, batch_size=16, lr=lr)
    model.eval()
    return model, tok, save_tiny(model, tok, out_dir)


def killing_multiply(a: int, b: int) -> int:
    """Multiplies two integers; SIGKILLs its own process at the call GRPO_TEST_KILL="tool:<n>" names (the kill
    test's stand-in for multiply, under that name).

    Args:
        a: The first factor.
        b: The second factor.
    """
    global _calls
    _calls += 1
    phase, _, n = os.environ.get("GRPO_TEST_KILL", "").partition(":")
    if phase == "tool" and _calls == int(n):
        os.kill(os.getpid(), signal.SIGKILL)
    return a * b


killing_multiply.__name__ = "multiply"  # the agent calls it by the name it learned
_calls = 0

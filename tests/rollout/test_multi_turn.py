"""Multi-turn rollouts with tools (grpo_fast.rollout.multi_turn) on the transformers engine, with the agent of
tool_agent.py, a real tiny model that replays scripted tool-calling conversations under greedy decoding.

The token accounting is checked against an independent reference: the chat template's own rendering of the
conversation the rollout reports, and the ids the engine really returned (recorded around the real engine)."""

from __future__ import annotations

import copy

import pytest
from tool_agent import SLOW_TIMEOUT, TOOLS, CounterEnv, call, tools_of

from grpo_fast.core.tiny_models import RESPONSE_TEMPLATE, build_char_tokenizer
from grpo_fast.errors import InfrastructureError
from grpo_fast.rollout.base import SamplingSpec
from grpo_fast.rollout.chat_turns import ChatFormat
from grpo_fast.rollout.environments import Environments, environment_tools
from grpo_fast.rollout.hf_engine import HFEngine
from grpo_fast.rollout.multi_turn import MultiTurn
from grpo_fast.rollout.prompts import PromptEncoder
from grpo_fast.rollout.python_tool import PythonEnvironment
from grpo_fast.rollout.tools import Tool, ToolRunner
from grpo_fast.sandbox import isolation
from grpo_fast.trainer.config import DataConfig


class RecordingEngine(HFEngine):
    """The real transformers engine, keeping (context ids, returned ids) of every request."""

    def __init__(self, model, tokenizer) -> None:
        super().__init__(model, tokenizer)
        self.requests: list[tuple[list[int], list[int]]] = []

    def generate(self, prompt_token_ids, sampling):
        out = super().generate(prompt_token_ids, sampling)
        self.requests += [(list(p), list(g[0].token_ids)) for p, g in zip(prompt_token_ids, out, strict=True)]
        return out

    def turns_of(self, prompt_ids: list[int], completion_ids: list[int]) -> list[list[int]]:
        """The ids the engine returned to the requests of one rollout: those whose context is its prompt and the
        start of its completion."""
        full = prompt_ids + completion_ids
        return [ret for ctx, ret in self.requests if ctx[: len(prompt_ids)] == prompt_ids and full[: len(ctx)] == ctx]


def multi_turn(tok, environment=None, *, max_iterations=3, max_completion_length=160, tools=TOOLS) -> MultiTurn:
    return MultiTurn(
        PromptEncoder(tok, DataConfig()),
        ChatFormat(tok),
        [Tool.of(fn) for fn in tools],
        None if environment is None else Environments.of(environment),
        max_iterations=max_iterations,
        max_completion_length=max_completion_length,
        max_model_len=256,
        timeout=SLOW_TIMEOUT,
    )


def greedy(tok, n: int = 1) -> SamplingSpec:
    return SamplingSpec(n=n, max_tokens=160, temperature=0.0, stop_token_ids=(tok.eos_token_id,), seed=0)


def rendered(tok, prompt: str, messages: list[dict], environment) -> list[int]:
    """The chat template's ids of the whole conversation: the reference the rollout's ids must equal."""
    user = [{"role": "user", "content": prompt + (" (start 0)" if environment else "")}]
    schemas = [t.schema for t in tools_of(CounterEnv() if environment else None)]
    out = tok.apply_chat_template(user + messages, tools=schemas, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("environment", [None, CounterEnv])
def test_the_trained_sequence_is_the_sampled_turns_and_the_templates_tool_blocks(tool_agent, environment):
    model, tok, _ = tool_agent
    engine = RecordingEngine(model, tok)
    prompts = ["m", "a", "x", "t"] + (["c"] if environment else [])
    out = multi_turn(tok, environment).generate(engine, [{"prompt": p} for p in prompts], greedy(tok))
    for i, (prompt, c) in enumerate(zip(prompts, out.completions, strict=True)):
        # The reference: the template renders the reported conversation to exactly the ids trained on.
        assert out.prompt_ids[i] + c.token_ids == rendered(tok, prompt, c.episode.messages, environment), prompt
        # The sampled tokens are the engine's, turn after turn, as ids (nothing re-tokenised).
        turns = engine.turns_of(out.prompt_ids[i], c.token_ids)
        assert [t for t, s in zip(c.token_ids, c.sampled, strict=True) if s] == [t for turn in turns for t in turn]
        assert len(c.sampled) == len(c.token_ids) == len(c.logprobs)
        assert all(lp == 0.0 for lp, s in zip(c.logprobs, c.sampled, strict=True) if not s)
        assert c.episode.turns == len(turns)
        if prompt != "t":  # one tool block per round of calls, every token of it masked
            assert c.num_sampled < len(c.token_ids)
    by_prompt = dict(zip(prompts, out.completions, strict=True))
    assert [m["content"] for m in by_prompt["m"].episode.messages] == ["", "408", "408"]
    assert by_prompt["m"].text == "408" and by_prompt["t"].text == "hi" and by_prompt["t"].sampled == [True] * 3


def test_failed_calls_reach_the_model_as_error_results_and_never_stop_the_step(tool_agent):
    model, tok, _ = tool_agent
    prompts = ["x", "s", "u", "b", "a"]
    out = multi_turn(tok).generate(HFEngine(model, tok), [{"prompt": p} for p in prompts], greedy(tok))
    slow = out.completions[prompts.index("s")]
    assert slow.episode.tool_seconds < 5.0  # the 5 s sleep was cut at the tool timeout (the call's own time)
    results = {p: c.episode.messages[1]["content"] for p, c in zip(prompts, out.completions, strict=True)}
    assert results["x"] == "error: explode: RuntimeError: the tool broke"
    assert results["s"] == f"error: slow: timed out after {SLOW_TIMEOUT:g} s"
    assert results["u"].startswith("error: no tool named 'nosuch'")
    assert results["b"] == "error: multiply: missing argument(s) ['b']"
    assert results["a"] == "v"  # the async tool, awaited on the runner's event loop
    failures = {p: c.episode.failures for p, c in zip(prompts, out.completions, strict=True)}
    assert failures == {"x": {"explode": 1}, "s": {"slow": 1}, "u": {"nosuch": 1}, "b": {"multiply": 1}, "a": {}}
    assert all(c.finish_reason == "stop" and c.episode.turns == 2 for c in out.completions)


def test_each_rollout_has_its_own_environment_reset_between_steps_and_scored_by_it(tool_agent):
    model, tok, _ = tool_agent
    rollouts = multi_turn(tok, CounterEnv)
    for _ in range(2):  # the second step reuses the pooled instances, reset
        out = rollouts.generate(HFEngine(model, tok), [{"prompt": "c"}], greedy(tok, n=3))
        for c in out.completions:
            assert [m["content"] for m in c.episode.messages if m["role"] == "tool"] == ["1", "3"]
            assert c.episode.environment_reward == 1.0 and c.episode.calls == 2
        assert len({id(c.episode.environment) for c in out.completions}) == 3
        assert "(start 0)" in tok.decode(out.prompt_ids[0])  # reset's text, appended to the user turn
    assert len(rollouts.environments._pool[None]) == 3


def test_max_tool_calling_iterations_and_the_token_budget_end_a_rollout(tool_agent):
    model, tok, _ = tool_agent
    once = multi_turn(tok, CounterEnv, max_iterations=1).generate(HFEngine(model, tok), [{"prompt": "c"}], greedy(tok))
    (c,) = once.completions
    assert c.episode.calls == 1 and c.episode.turns == 2  # the second turn's call never ran
    assert "tool_calls" in c.episode.messages[-1] and c.finish_reason == "stop"
    short = multi_turn(tok, max_completion_length=24).generate(HFEngine(model, tok), [{"prompt": "m"}], greedy(tok))
    (c,) = short.completions
    assert c.finish_reason == "length" and c.sampled == [True] * len(c.token_ids)  # the result did not fit
    assert [m["role"] for m in c.episode.messages] == ["assistant"] and len(c.token_ids) <= 24


class Other:
    def reset(self, **row):
        return None

    def ping(self) -> str:
        """Answers pong."""
        return "pong"


def test_rows_choose_their_environment_and_see_only_its_tools(tool_agent):
    model, tok, _ = tool_agent
    rollouts = multi_turn(tok, {"counter": CounterEnv, "other": Other})
    rows = [{"prompt": "c", "environment": "counter"}, {"prompt": "t", "environment": "other"}]
    out = rollouts.generate(HFEngine(model, tok), rows, greedy(tok))
    counter, other = (tok.decode(ids) for ids in out.prompt_ids)
    assert "increment(step)" in counter and "ping" not in counter
    assert "ping()" in other and "increment" not in other
    with pytest.raises(ValueError, match=r"environment='nope'.*\['counter', 'other'\]"):
        rollouts.generate(HFEngine(model, tok), [{"prompt": "c", "environment": "nope"}], greedy(tok))


def undocumented(x):
    return x


class NoReset:
    def act(self, x: int) -> int:
        """Acts.

        Args:
            x: The input.
        """
        return x


def test_what_cannot_run_a_multi_turn_rollout_is_named():
    with pytest.raises(ValueError, match="tool 'undocumented': cannot build its JSON schema"):
        Tool.of(undocumented)
    with pytest.raises(ValueError, match=r"the instance it made \(NoReset\) has no callable reset"):
        Environments.of(NoReset)
    plain = build_char_tokenizer()
    with pytest.raises(ValueError, match="chat template"):
        ChatFormat(plain)
    plain.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(ValueError, match="response_template"):
        ChatFormat(plain)
    plain.response_template = {"fields": {"content": {"content": "text"}}}
    with pytest.raises(ValueError, match="does not render a tool call"):
        ChatFormat(plain)


def broken_sandbox() -> str:
    """A tool whose machinery is gone."""
    raise InfrastructureError("the sandbox cannot start")


@pytest.mark.skipif(isolation() not in ("namespaces", "bwrap"), reason="no local code sandbox on this machine")
def test_the_sandboxed_python_environment_keeps_state_and_its_infrastructure_failures_stop_the_step():
    environments = Environments.of(PythonEnvironment)
    (env,) = environments.acquire([None])
    env.reset()
    tools = {t.name: t for t in environment_tools(env)}
    runner = ToolRunner(timeout=30)
    try:
        assert runner.call(tools, call("python", code="x = 6")).failure is None
        answer = runner.call(tools, call("python", code="x * 7"))  # the variable lives in the rollout's sandbox
        assert answer.text.strip() == "42" and answer.failure is None
        assert "ZeroDivisionError" in runner.call(tools, call("python", code="1/0")).text  # the model's to read
        with pytest.raises(InfrastructureError, match="the sandbox cannot start"):  # ours: loud, never a result
            runner.call({"broken_sandbox": Tool.of(broken_sandbox)}, call("broken_sandbox"))
    finally:
        environments.close()


def test_a_call_the_parser_rejects_gets_an_error_result_and_the_model_answers(tool_agent):
    model, tok, _ = tool_agent
    strict = copy.deepcopy(tok)  # the same chat template, but arguments must be JSON: "a=12 b=34" is malformed
    fields = RESPONSE_TEMPLATE["fields"]
    strict.response_template = {**RESPONSE_TEMPLATE, "fields": {**fields, "tool_calls": {**fields["tool_calls"]}}}
    strict.response_template["fields"]["tool_calls"].update(content="json", content_args={})
    out = multi_turn(strict).generate(HFEngine(model, strict), [{"prompt": "m"}], greedy(strict))
    (c,) = out.completions
    assert c.episode.messages[1] == {
        "role": "tool",
        "name": "unknown",
        "content": "error: the tool call could not be parsed",
    }
    assert c.episode.failures == {"unknown": 1} and c.episode.turns == 2 and c.finish_reason == "stop"

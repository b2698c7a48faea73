"""Multi-turn rollouts with tools: the model writes a turn, its tool calls run, their results go back into the
sequence, and it writes the next turn, until a turn calls no tool, the rollout runs out of tokens, or it has had
`max_iterations` rounds of tool calls.

Per step, every row's n rollouts start together. Each rollout has its own environment instance (reset with its
row; text the reset returns is appended to the prompt's last user message) and its own tools (the run's plain
tools and its environment's methods), rendered into its prompt by the chat template. A round is one engine call
for every rollout still going (turns of different rollouts are batched, never one call per rollout), then the
tool calls of all of them, one rollout's calls in order (where they run: grpo_fast.rollout.tools.ToolRunner).

The completion trained on is the turns' sampled ids with the tool-result blocks between them, concatenated as ids
(grpo_fast.rollout.chat_turns: nothing is re-tokenised); `Completion.sampled` marks the inserted tokens, which stay
in the sequence (the model reads them) but out of the loss and of every token-level metric, with logprob 0.0.

Budgets, as TRL counts them: max_completion_length bounds the whole completion, sampled and inserted tokens
together, and max_model_len the prompt plus completion. A turn gets at most what is left; a tool result that
would not fit ends the rollout before it ("length", the unanswered call rolled back), as does a turn cut at its
token limit (a call in a truncated turn never runs).

A turn the parser rejects (a malformed tool call) gets an error as the tool's result, as does every failed call
(grpo_fast.rollout.tools); the model may try again in its next turn.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec, ToolEpisode
from grpo_fast.rollout.chat_turns import ChatFormat
from grpo_fast.rollout.environments import Environments, environment_tools
from grpo_fast.rollout.generation import RolloutOutput
from grpo_fast.rollout.prompts import PromptEncoder
from grpo_fast.rollout.tools import Tool, ToolRunner

TURN_SEED_STRIDE = 1_000_033
"""Turn t of a call seeded s is seeded s + t * TURN_SEED_STRIDE (its rollout i: + i), so turns never share seeds."""


@dataclass
class _Rollout:
    """One rollout under way."""

    prompt_ids: list[int]
    tools: dict[str, Tool]
    environment: object | None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)
    episode: ToolEpisode = field(default_factory=ToolEpisode)
    finish: str = "stop"
    pending: list | None = None  # the tool calls of its last turn (None: a malformed turn)

    @property
    def schemas(self) -> list[dict]:
        return [t.schema for t in self.tools.values()]

    def completion(self) -> Completion:
        last = next((m for m in reversed(self.episode.messages) if m["role"] == "assistant"), None)
        text = last.get("content", "") if last else ""
        return Completion(self.ids, self.logprobs, text, self.finish, sampled=self.sampled, episode=self.episode)


class MultiTurn:
    """Multi-turn rollouts with `tools` (grpo_fast.rollout.tools.Tool) and, optionally, `environments` (see module
    doc). `timeout`: seconds per tool call; `workers`: rollouts whose tool calls run at once (1: in the calling
    thread, as TRL runs them)."""

    def __init__(
        self,
        prompts: PromptEncoder,
        chat: ChatFormat,
        tools: Sequence[Tool],
        environments: Environments | None,
        *,
        max_iterations: int | None,
        max_completion_length: int,
        max_model_len: int,
        timeout: float,
        workers: int = 1,
    ) -> None:
        self.prompts, self.chat, self.tools, self.environments = prompts, chat, list(tools), environments
        self.max_iterations = max_iterations
        self.max_completion_length, self.max_model_len = max_completion_length, max_model_len
        self.runner = ToolRunner(timeout, workers)
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tools: two tools share a name ({sorted(names)})")

    def generate(self, engine: RolloutEngine, rows, sampling: SamplingSpec, keys=None) -> RolloutOutput:
        labels = [label for label in range(len(rows)) for _ in range(sampling.n)]
        environments = [None] * len(labels)
        if self.environments is not None:  # one distinct instance per rollout
            environments = self.environments.acquire([self.environments.name_of(rows[i]) for i in labels])
        rollouts = [self._start(rows[i], i, env) for i, env in zip(labels, environments, strict=True)]
        going, turn, seconds_tools = list(range(len(rollouts))), 0, 0.0
        while going:
            self._sample_turn(engine, [rollouts[i] for i in going], sampling, turn)
            turn += 1
            calling = [i for i in going if self._wants_tools(rollouts[i], turn)]
            start = time.perf_counter()
            self.runner.map(self._run_tools, [rollouts[i] for i in calling])
            seconds_tools += time.perf_counter() - start
            going = [i for i in calling if rollouts[i].finish == "stop"]
        self._finish(rollouts)
        completions = [r.completion() for r in rollouts]
        return RolloutOutput([r.prompt_ids for r in rollouts], completions, seconds_tools=seconds_tools)

    def close(self) -> None:
        self.runner.close()
        if self.environments is not None:
            self.environments.close()

    # -- one rollout ---------------------------------------------------------------------------------------------

    def _start(self, row: dict, label: int, environment: object | None) -> _Rollout:
        """A fresh rollout of `row` (the call's row `label`): its environment reset, its tools, its prompt ids."""
        messages = self.prompts.messages(row["prompt"])
        tools = {t.name: t for t in self.tools}
        if environment is not None:
            observation = self.environments.reset(environment, row)
            if observation is not None:
                last = messages[-1]
                messages = [*messages[:-1], {**last, "content": f"{last['content']}{observation}"}]
            for tool in environment_tools(environment):
                if tool.name in tools:
                    raise ValueError(f"tool {tool.name!r}: both a tool and a method of {type(environment).__name__}")
                tools[tool.name] = tool
        ids = self.prompts.checked(label, self.chat.prompt_ids(messages, [t.schema for t in tools.values()]))
        return _Rollout(ids, tools, environment, episode=ToolEpisode(environment=environment))

    def _sample_turn(self, engine: RolloutEngine, rollouts: list[_Rollout], sampling: SamplingSpec, turn: int) -> None:
        """One engine call: the next turn of every rollout in `rollouts`, within each one's budget."""
        budgets = [self._budget(r) for r in rollouts]
        seed = None if sampling.seed is None else sampling.seed + turn * TURN_SEED_STRIDE
        spec = dataclasses.replace(sampling, n=1, max_tokens=max(budgets), seed=seed)
        contexts = [r.prompt_ids + r.ids for r in rollouts]
        outs = engine.generate(contexts, spec)
        for r, context, budget, (out,) in zip(rollouts, contexts, budgets, outs, strict=True):
            ids, lps = out.token_ids[:budget], (out.logprobs or [0.0] * len(out.token_ids))[:budget]
            r.ids += ids
            r.logprobs += lps
            r.sampled += [True] * len(ids)
            r.episode.turns += 1
            truncated = out.finish_reason == "length" or len(ids) < len(out.token_ids)
            message = self.chat.parse(ids, context, r.schemas)
            if truncated:  # a call in a cut-off turn never runs
                r.finish = "length"
                message = {"role": "assistant", "content": (message or {}).get("content", "")}
            r.pending = None if message is None else message.get("tool_calls") or []
            r.episode.messages.append(message or {"role": "assistant", "content": self._text(ids)})

    def _wants_tools(self, r: _Rollout, turns: int) -> bool:
        """Whether the rollout's last turn gets tool results: it called (or tried to), it was not cut off, and it
        has rounds left."""
        if r.finish != "stop" or r.pending == []:
            return False
        return self.max_iterations is None or turns <= self.max_iterations

    def _run_tools(self, r: _Rollout) -> None:
        """Run the last turn's calls in order and append their results; a result that would not fit ends the
        rollout instead ("length")."""
        if r.pending is None:
            results = [("unknown", "error: the tool call could not be parsed", "malformed", 0.0)]
        else:
            results = [(x.name, x.text, x.failure, x.seconds) for x in map(self._call(r), r.pending)]
        episode = r.episode
        episode.calls += len(results)
        messages = [{"role": "tool", "name": name, "content": text} for name, text, _, _ in results]
        for name, _, failure, seconds in results:
            episode.tool_seconds += seconds
            if failure is not None:
                episode.failures[name] = episode.failures.get(name, 0) + 1
        suffix = self.chat.tool_suffix_ids(messages)
        fits = len(r.ids) + len(suffix) < self.max_completion_length
        if not fits or len(r.prompt_ids) + len(r.ids) + len(suffix) >= self.max_model_len:
            r.finish = "length"
            return
        episode.messages += messages
        r.ids += suffix
        r.logprobs += [0.0] * len(suffix)
        r.sampled += [False] * len(suffix)

    def _call(self, r: _Rollout):
        if r.environment is None:
            return lambda call: self.runner.call(r.tools, call)
        return lambda call: self.environments.call(r.environment, self.runner, r.tools, call)

    def _budget(self, r: _Rollout) -> int:
        room = min(self.max_completion_length - len(r.ids), self.max_model_len - len(r.prompt_ids) - len(r.ids))
        return max(room, 1)

    def _finish(self, rollouts: list[_Rollout]) -> None:
        """The environments' rewards of the finished rollouts (grpo_fast.rollout.environments)."""
        if self.environments is not None:
            rewards = self.environments.rewards([r.environment for r in rollouts], self.runner)
            for r, value in zip(rollouts, rewards, strict=True):
                r.episode.environment_reward = value

    def _text(self, ids: list[int]) -> str:
        return self.chat.tokenizer.decode(ids, skip_special_tokens=True)

"""Multi-turn rollouts with tools: the model writes a turn, its tool calls run, their results go back into the
sequence, and it writes the next turn, until a turn calls no tool, the rollout runs out of tokens, or it has had
`max_iterations` rounds of tool calls.

Each rollout has its own environment instance (reset with its row; text the reset returns is appended to the
prompt's last user message), held until its rollout is handed out, and its own tools (the run's plain tools and
its environment's methods), rendered into its prompt by the chat template. With rollout.mode sync every row's n
rollouts start together and a round is one engine call for every rollout still going (turns of different rollouts
are batched, never one call per rollout), then the tool calls of all of them, one rollout's calls in order (where
they run: grpo_fast.rollout.tools.ToolRunner). With partial and async the same rollouts run in the rounds of
grpo_fast.rollout.partial (the `Rollouts` contract: a turn may span rounds; `end_turns` takes each rollout whose
turn ended), in the process that generates: the trainer's (partial) or the engine process (async), where the tools
run and the environments live, so a tool call's latency overlaps training.

The completion trained on is the turns' sampled ids with the tool-result blocks between them, concatenated as ids
(grpo_fast.rollout.chat_turns: nothing is re-tokenised); `Completion.sampled` marks the inserted tokens, which stay
in the sequence (the model reads them) but out of the loss, of every token-level metric and of the stale-token
corrections, with logprob 0.0.

Budgets, as TRL counts them: max_completion_length bounds the whole completion, sampled and inserted tokens
together, and max_model_len the prompt plus completion. A turn gets at most what is left; a tool result that
would not fit ends the rollout before it ("length": the call ran, and an environment keeps its effect, but its
result is not in the sequence), as does a turn cut at its token limit (a call in a truncated turn never runs; the
reward sees the turn's text). A turn that stopped on another stop token than the end-of-turn one (rollout.stop)
gets the end-of-turn token before its tool results, inserted, as the template renders the turn.

A turn the parser rejects (a malformed tool call) gets an error as the tool's result, as does every failed call
(grpo_fast.rollout.tools); the model may try again in its next turn.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

from grpo_fast.rollout.base import RolloutEngine, SamplingSpec, ToolEpisode
from grpo_fast.rollout.chat_turns import ChatFormat
from grpo_fast.rollout.contract import Capabilities, import_path
from grpo_fast.rollout.environments import Environments, environment_tools
from grpo_fast.rollout.generation import PartialCompletion, RolloutOutput, Rollouts
from grpo_fast.rollout.prompts import PromptEncoder
from grpo_fast.rollout.tools import Tool, ToolRunner

TURN_SEED_STRIDE = 1_000_033
"""Turn t of a call seeded s is seeded s + t * TURN_SEED_STRIDE (its rollout i: + i), so turns never share seeds."""
MULTI_TURN = Capabilities(
    "multi-turn rollouts (tools, environments)",
    lockstep_engine=False,
    every_rank=False,
    limits="their tools and environments act once per rollout, their turns call the engine rank by rank",
)
"""What multi-turn rollouts can take part in; in an engine process only when their tools and environment factories
import by path (`MultiTurn.capabilities`)."""


@dataclass
class _Agent:
    """A rollout's live state: its tools by name, its environment instance, the tool calls of its last turn (None:
    a malformed turn)."""

    tools: dict[str, Tool]
    environment: object | None
    pending: list | None = None

    @property
    def schemas(self) -> list[dict]:
        return [t.schema for t in self.tools.values()]


RENDERING_PROBE = [{"role": "user", "content": "Probe: 12*34= ? café, naïve; 数 (tab\there)."}]


class MultiTurn(Rollouts):
    """Multi-turn rollouts with `tools` (grpo_fast.rollout.tools.Tool) and, optionally, `environments` (see module
    doc). `timeout`: seconds per tool call; `workers`: rollouts whose tool calls run at once (1: in the calling
    thread, as TRL runs them)."""

    calls_tools = True
    reads_rows = True

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
        self.max_iterations, self.timeout, self.workers = max_iterations, timeout, workers
        self.max_completion_length, self.max_model_len = max_completion_length, max_model_len
        self.runner = ToolRunner(timeout, workers)
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tools: two tools share a name ({sorted(names)})")

    @property
    def capabilities(self) -> Capabilities:
        unmovable = [name for name, path in self._paths().items() if path is None]
        if not unmovable:
            return MULTI_TURN
        why = f"{', '.join(unmovable)} cannot be imported by path there: define it at a module's top level"
        return dataclasses.replace(MULTI_TURN, engine_process=False, limits=why)

    def generate(self, engine: RolloutEngine, rows, sampling: SamplingSpec, keys=None) -> RolloutOutput:
        """Whole rollouts: every turn of every rollout still going in one engine call, until none goes on."""
        members = [m for label, row in enumerate(rows) for m in self.begin(label, row, None, sampling.n)]
        going, turn, seconds_tools = members, 0, 0.0
        while going:
            budgets = [self.budget(m, self.max_completion_length) for m in going]
            seed = None if sampling.seed is None else sampling.seed + turn * TURN_SEED_STRIDE
            spec = dataclasses.replace(sampling, n=1, max_tokens=max(budgets), seed=seed)
            outs = engine.generate([m.prompt_ids + m.token_ids for m in going], spec)
            ended = [(m, m.extend(out, b, None)) for m, b, (out,) in zip(going, budgets, outs, strict=True)]
            seconds_tools += self.end_turns(ended)
            going, turn = [m for m in going if m.running], turn + 1
        self.release(members)  # scored together; reused by the next call, as TRL reuses them from step to step
        completions = [m.completion() for m in members]
        for c in completions:
            c.text = c.episode.answer
        return RolloutOutput([m.prompt_ids for m in members], completions, seconds_tools=seconds_tools)

    def begin(self, row: int, data: dict | None, prompt_ids: list[int] | None, n: int) -> list[PartialCompletion]:
        """n rollouts of dataset row `data` (index `row`, for errors): each with its environment instance, reset,
        and its own prompt ids (the tools' schemas rendered, the reset's text appended)."""
        environments = [None] * n
        if self.environments is not None:  # one distinct instance per rollout
            environments = self.environments.acquire([self.environments.name_of(data)] * n)
        return [self._start(data, row, env) for env in environments]

    def budget(self, member: PartialCompletion, max_len: int) -> int:
        used = len(member.token_ids)
        return max(min(self.max_completion_length - used, self.max_model_len - len(member.prompt_ids) - used), 0)

    def end_turns(self, ended: list[tuple[PartialCompletion, bool]]) -> float:
        """Each turn parsed into the episode's assistant message; the calls of those that made some (and were not
        cut off, and have rounds left) run, their results appended, and those go on; the others finish."""
        for member, stopped in ended:
            self._record_turn(member, stopped)
        calling = [m for m, _ in ended if self._wants_tools(m)]
        start = time.perf_counter()
        self.runner.map(self._run_tools, calling)
        seconds = time.perf_counter() - start
        called = {id(m) for m in calling}
        for member, stopped in ended:
            if id(member) not in called:
                member.finish_reason = member.finish_reason or ("stop" if stopped else "length")
            if not member.running:
                self._finish(member)
        return seconds

    def release(self, members: list[PartialCompletion]) -> None:
        """Each rollout among `members` (handed out together) whose environment was discarded gets the lowest
        environment reward of the others (0.0 when none has one): it never gains by running its environment out of
        time. Their instances go back to the pool."""
        if self.environments is None:
            return
        episodes = [m.episode for m in members if m.episode is not None]
        scored = [e.environment_reward for e in episodes if not e.environment_discarded]
        floor = min((r for r in scored if r is not None), default=0.0)
        for episode in episodes:
            if episode.environment_discarded:
                episode.environment_reward = floor
        self.environments.release([m.agent.environment for m in members if m.agent is not None])

    def has_environment_reward(self) -> bool:
        return self.environments is not None and self.environments.has_reward()

    def recipe(self) -> dict:
        """Its tools and environment factories by import path, its limits, and the prompt settings."""
        paths = self._paths()
        factories = None
        if self.environments is not None:
            named = {name: paths[f"environment_factory[{name!r}]"] for name in self.environments.factories}
            factories = named if self.environments.routed else named[None]
        return {
            "kind": "multi_turn",
            "tools": [paths[f"tool {t.name!r}"] for t in self.tools],
            "environment_factory": factories,
            "max_iterations": self.max_iterations,
            "max_completion_length": self.max_completion_length,
            "max_model_len": self.max_model_len,
            "timeout": self.timeout,
            "workers": self.workers,
            "system_prompt": self.prompts.data.system_prompt,
            "use_chat_template": self.prompts.data.use_chat_template,
            "max_prompt_tokens": self.prompts.max_tokens,
            "chat_template": self.chat.chat_template or getattr(self.chat.tokenizer, "chat_template", None),
            "chat_template_kwargs": self.chat.template_kwargs,
            "rendering": self.rendering(),
        }

    def rendering(self) -> list[int]:
        """The ids of a probe conversation (multi-byte characters, the tools' schemas) as this process renders it: an
        engine process must render it to the same ids as the trainer, or its rollouts start from other prompts."""
        return self.chat.prompt_ids(RENDERING_PROBE, [t.schema for t in self.tools])

    def close(self) -> None:
        self.runner.close()
        if self.environments is not None:
            self.environments.close()

    # -- one rollout ---------------------------------------------------------------------------------------------

    def _paths(self) -> dict[str, str | None]:
        """Each tool's and environment factory's import path (None: not importable), by how errors name it."""
        paths = {f"tool {t.name!r}": import_path(t.fn) for t in self.tools}
        for name, factory in (self.environments.factories if self.environments else {}).items():
            paths[f"environment_factory[{name!r}]"] = import_path(factory)
        return paths

    def _start(self, row: dict, label: int, environment: object | None) -> PartialCompletion:
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
        return PartialCompletion(
            prompt_ids=ids, episode=ToolEpisode(environment=environment), agent=_Agent(tools, environment)
        )

    def _record_turn(self, m: PartialCompletion, stopped: bool) -> None:
        """The turn since m.turn_start parsed into the episode's next assistant message (its tool calls pending); a
        turn cut off at its token limit ends the rollout, and its calls never run."""
        turn, context = m.token_ids[m.turn_start :], m.prompt_ids + m.token_ids[: m.turn_start]
        m.episode.turns += 1
        message = self.chat.parse(turn, context, m.agent.schemas)
        if not stopped:
            m.finish_reason = "length"
            content = self._text(turn) if message is None else message.get("content", "")  # a call cut off: its text
            message = {"role": "assistant", "content": content}
        m.agent.pending = None if message is None else message.get("tool_calls") or []
        m.episode.messages.append(message or {"role": "assistant", "content": self._text(turn)})

    def _wants_tools(self, m: PartialCompletion) -> bool:
        """Whether the rollout's last turn gets tool results: it called (or tried to), it was not cut off, and it
        has rounds left."""
        if not m.running or m.agent.pending == []:
            return False
        return self.max_iterations is None or m.episode.turns <= self.max_iterations

    def _run_tools(self, m: PartialCompletion) -> None:
        """Run the last turn's calls in order and append their results; a result that would not fit ends the
        rollout instead ("length")."""
        if m.agent.pending is None:
            results = [("unknown", "error: the tool call could not be parsed", "malformed", 0.0)]
        else:
            results = [(x.name, x.text, x.failure, x.seconds) for x in map(self._call(m), m.agent.pending)]
        episode = m.episode
        episode.calls += len(results)
        messages = [{"role": "tool", "name": name, "content": text} for name, text, _, _ in results]
        for name, _, failure, seconds in results:
            episode.tool_seconds += seconds
            if failure is not None:
                episode.failures[name] = episode.failures.get(name, 0) + 1
        suffix = self.chat.tool_suffix_ids(messages)
        if m.token_ids[-1:] != [self.chat.end_of_turn_id]:  # stopped on a rollout.stop token: close the turn first
            suffix = [self.chat.end_of_turn_id, *suffix]
        fits = len(m.token_ids) + len(suffix) < self.max_completion_length
        if not fits or len(m.prompt_ids) + len(m.token_ids) + len(suffix) >= self.max_model_len:
            m.finish_reason = "length"
            return
        episode.messages += messages
        m.insert(suffix)
        m.turn_start = len(m.token_ids)

    def _call(self, m: PartialCompletion):
        if m.agent.environment is None:
            return lambda call: self.runner.call(m.agent.tools, call)
        return lambda call: self.environments.call(m.agent.environment, self.runner, m.agent.tools, call)

    def _finish(self, m: PartialCompletion) -> None:
        """A finished rollout's environment reward (grpo_fast.rollout.environments); one whose environment was
        discarded gets its reward when it is handed out (`release`)."""
        if m.agent.environment is not None:
            m.episode.environment_reward = self.environments.reward(m.agent.environment, self.runner)
            m.episode.environment_discarded = self.environments.is_discarded(m.agent.environment)

    def _text(self, ids: list[int]) -> str:
        return self.chat.tokenizer.decode(ids, skip_special_tokens=True)

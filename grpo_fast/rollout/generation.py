"""How a step's completions are produced from its dataset rows: the `Rollouts` contract (a rollout kind) and its two
simplest forms, one engine call (`SingleTurn`) and a user's own rollout function (`CustomRollouts`, TRL's
`rollout_func`). Multi-turn rollouts with tools are grpo_fast.rollout.multi_turn.MultiTurn.

A kind produces whole rollouts in one `generate` (rollout.mode sync), and, when its `capabilities` say so, rollouts
continued over rounds (partial and async, driven by grpo_fast.rollout.partial.PartialRollouts): `begin` starts a
prompt's n rollouts as `PartialCompletion`s, the pool extends each by at most `budget` tokens a round, and
`end_turns` takes every rollout whose turn stopped or ran out of tokens (it ends it, or appends a tool's result and
lets it go on). Every generate returns a `RolloutOutput`: for each row, `sampling.n` completions in a row, each with
the prompt ids it was generated from (they differ within a group when an environment's reset adds to the prompt),
and the extra per-completion columns its reward functions receive.
"""

from __future__ import annotations

import abc
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec, ToolEpisode
from grpo_fast.rollout.contract import Capabilities
from grpo_fast.rollout.environments import Environments
from grpo_fast.rollout.prompts import PromptEncoder


@dataclass
class RolloutOutput:
    """[R * n] completions of R rows, row by row; prompt_ids [R * n]; columns: name -> [R * n] values for the
    reward functions (TRL's extra fields of rollout_func); seconds_tools: wall-clock seconds spent running tools."""

    prompt_ids: list[list[int]]
    completions: list[Completion]
    columns: dict[str, list] = field(default_factory=dict)
    seconds_tools: float = 0.0


@dataclass
class PartialCompletion:
    """One rollout under way: its tokens and behaviour logprobs so far (empty once a round came without them: an
    engine that returns none; never made up); `segments`, the (first token index, weight
    version) of each round that added sampled tokens; `sampled`, False for tokens the kind inserted (a tool's
    result: in the sequence, out of the loss; empty: all sampled); `prompt_ids`, its own prompt when it is not its
    group's (an environment's reset adds to it); `turn_start`, where its current turn began; `episode`, a multi-turn
    rollout's conversation; `agent`, the kind's live state (tools, environment instance, never plain data).
    finish_reason None: still running."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segments: list[tuple[int, int]] = field(default_factory=list)
    finish_reason: str | None = None
    sampled: list[bool] = field(default_factory=list)
    prompt_ids: list[int] | None = None
    turn_start: int = 0
    episode: ToolEpisode | None = None
    agent: object = field(default=None, compare=False, repr=False)

    @property
    def running(self) -> bool:
        return self.finish_reason is None

    def oldest_version(self, default: int) -> int:
        return self.segments[0][1] if self.segments else default

    def extend(self, out: Completion, budget: int, version: int | None) -> bool:
        """Appends at most `budget` of `out`'s sampled tokens (a segment of weight `version` when it adds tokens and
        version is not None); -> whether its turn stopped on a stop token within them."""
        ids = out.token_ids[:budget]
        whole = len(out.logprobs) == len(out.token_ids) and self._has_logprobs()
        if ids and version is not None and (not self.segments or self.segments[-1][1] != version):
            self.segments.append((len(self.token_ids), version))
        self.token_ids += ids
        self.logprobs = self.logprobs + out.logprobs[:budget] if whole else []
        if self.sampled:
            self.sampled += [True] * len(ids)
        return out.finish_reason == "stop" and len(ids) == len(out.token_ids)

    def insert(self, ids: list[int]) -> None:
        """Appends tokens the model did not sample (a tool's result): logprob 0.0, out of the loss."""
        self.sampled = (self.sampled or [True] * len(self.token_ids)) + [False] * len(ids)
        if self._has_logprobs():
            self.logprobs += [0.0] * len(ids)
        self.token_ids += ids

    def _has_logprobs(self) -> bool:
        return len(self.logprobs) == len(self.token_ids)

    def completion(self) -> Completion:
        """The completion so far, without its text: rewards score the decode of its whole ids in its prompt's
        context (grpo_fast.rollout.texts) or its episode's answer, never the rounds' texts joined."""
        sampled = self.sampled or ([True] * len(self.token_ids) if self.episode is not None else [])
        return Completion(
            list(self.token_ids),
            list(self.logprobs),  # empty where the engine gave none: the loss then has no behaviour logprobs
            "",
            self.finish_reason or "length",
            segments=list(self.segments),
            sampled=list(sampled),  # a multi-turn completion's mask is always whole
            episode=self.episode,
        )


class Rollouts(abc.ABC):
    """A rollout kind (see module doc). `capabilities` says which schedulers and engines it can run with
    (grpo_fast.rollout.contract); `calls_tools`, whether its completions carry tool episodes."""

    capabilities = Capabilities("the rollout kind")
    calls_tools = False
    environments: Environments | None = None
    """The environments its rollouts run in (grpo_fast.rollout.environments), None for a kind without them."""
    reads_rows = False
    """Whether `begin` reads the dataset row itself (its chat messages, an environment's reset): the row then goes
    with its prompt to the rounds (and to the engine process)."""

    @abc.abstractmethod
    def generate(
        self, engine: RolloutEngine, rows: Sequence[dict], sampling: SamplingSpec, keys: Sequence[int] | None = None
    ) -> RolloutOutput:
        """`sampling.n` whole completions of each of `rows`; `keys` (the rows' dataset indices) let prompt ids be
        cached."""

    def begin(self, row: int, data: dict | None, prompt_ids: list[int], n: int) -> list[PartialCompletion]:
        """The n rollouts of dataset row `row` (`data`: the row itself, `prompt_ids`: its encoded prompt), to be
        continued over rounds; their prompt_ids None: the row's."""
        return [PartialCompletion() for _ in range(n)]

    def budget(self, member: PartialCompletion, max_len: int) -> int:
        """Tokens `member` may still add (max_len: rollout.max_completion_length)."""
        return max_len - len(member.token_ids)

    def end_turns(self, ended: list[tuple[PartialCompletion, bool]]) -> float:
        """The rollouts whose turn just ended, each with whether it stopped on a stop token (else it ran out of
        tokens): each is finished, or goes on; -> the seconds spent running tools."""
        for member, stopped in ended:
            member.finish_reason = "stop" if stopped else "length"
        return 0.0

    def release(self, members: list[PartialCompletion]) -> None:
        """Returns what finished rollouts hold (environment instances) once they are handed out."""
        return None

    def has_environment_reward(self) -> bool:
        """Whether its environments score rollouts (get_reward): the run then adds the `environment_reward` reward."""
        return False

    def recipe(self) -> dict:
        """Plain data that rebuilds it in an engine process (grpo_fast.rollout.rollouts.rollouts_from_recipe)."""
        raise NotImplementedError(f"{self.capabilities.name} cannot run in the engine process")

    def close(self) -> None:
        """Frees what it holds (tool threads, environments)."""
        return None


@dataclass
class SingleTurn(Rollouts):
    """One engine call: a prompt's ids, its n completions."""

    prompts: PromptEncoder | None

    capabilities = Capabilities("single-turn rollouts")

    def generate(self, engine, rows, sampling, keys=None) -> RolloutOutput:
        ids = [self.prompts.row_ids(row, key) for row, key in zip(rows, keys or [None] * len(rows), strict=True)]
        groups = engine.generate(ids, sampling)
        return RolloutOutput([p for p in ids for _ in range(sampling.n)], [c for g in groups for c in g])

    def recipe(self) -> dict:
        return {"kind": "single_turn"}


@dataclass
class CustomRollouts(Rollouts):
    """TRL's `rollout_func(prompts, trainer) -> {"prompt_ids", "completion_ids", "logprobs", ...}`: called with the
    prompt of every rollout (each row's repeated n times, TRL's layout), it returns one entry per rollout in each
    list. Optional "env_mask" (1: a token the model sampled, 0: one inserted, e.g. an environment's feedback)
    masks the inserted tokens out of the loss; every other key is a column for the reward functions. `call` is the
    function with the trainer bound."""

    call: Callable[[list], dict]
    tokenizer: object
    stop_ids: tuple[int, ...]

    capabilities = Capabilities(
        "a rollout_func",
        rounds=False,
        engine_process=False,
        lockstep_engine=False,
        limits="it returns whole completions in one call, in the trainer's process",
    )

    def generate(self, engine, rows, sampling, keys=None) -> RolloutOutput:
        prompts = [row["prompt"] for row in rows for _ in range(sampling.n)]
        out = self.call(prompts)
        if not isinstance(out, dict):
            raise ValueError(f"rollout_func: expected a dict, got {type(out).__name__}")
        missing = sorted({"prompt_ids", "completion_ids", "logprobs"} - set(out))
        if missing:
            raise ValueError(f"rollout_func: its output lacks {missing} (it returned {sorted(out)})")
        n = len(prompts)
        for key, values in out.items():
            if not isinstance(values, (list, tuple)) or len(values) != n:
                got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
                raise ValueError(f"rollout_func: {key!r} must hold one entry per rollout ({n}), got {got}")
        masks = out.get("env_mask") or [None] * n
        prompt_ids = [_token_ids(p, f"prompt_ids[{i}]", empty=False) for i, p in enumerate(out["prompt_ids"])]
        completions = []
        for i, (ids, lps, mask) in enumerate(zip(out["completion_ids"], out["logprobs"], masks, strict=True)):
            ids, lps = _token_ids(ids, f"completion_ids[{i}]"), _logprobs(lps, f"logprobs[{i}]")
            if lps and len(lps) != len(ids):
                raise ValueError(f"rollout_func: rollout {i} has {len(ids)} completion ids but {len(lps)} logprobs")
            if mask is not None and len(mask) != len(ids):
                raise ValueError(f"rollout_func: rollout {i} has {len(ids)} completion ids but {len(mask)} env_mask")
            finish = "stop" if ids and ids[-1] in self.stop_ids else "length"
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            sampled = [bool(m) for m in mask] if mask is not None else []
            completions.append(Completion(ids, lps, text, finish, sampled=sampled))
        columns = {
            k: list(v) for k, v in out.items() if k not in ("prompt_ids", "completion_ids", "logprobs", "env_mask")
        }
        return RolloutOutput(prompt_ids, completions, columns)


def _token_ids(values, key: str, empty: bool = True) -> list[int]:
    """A rollout_func's token ids as ints; ValueError naming `key` for anything but non-negative integers (or an
    empty list where `empty` is false)."""
    if not isinstance(values, (list, tuple)) or (not values and not empty):
        raise ValueError(f"rollout_func: {key}: expected a {'' if empty else 'non-empty '}list of token ids")
    ids = []
    for x in values:
        if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 0:
            raise ValueError(f"rollout_func: {key}: expected non-negative integer token ids, got {x!r}")
        ids.append(int(x))
    return ids


def _logprobs(values, key: str) -> list[float]:
    """A rollout_func's sampling logprobs as floats; ValueError naming `key` for one that is not a finite number
    <= 0 (a probability's log)."""
    lps = []
    for x in values or []:
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x) or x > 1e-6:
            raise ValueError(f"rollout_func: {key}: expected finite logprobs <= 0, got {x!r}")
        lps.append(float(x))
    return lps

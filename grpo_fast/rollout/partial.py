"""Partial rollouts: a step generates in rounds of a few tokens and stops as soon as it has the complete
groups it needs; the completions still running wait for a later step and continue there under that step's
weights, instead of the whole step waiting for its slowest completion.

A round is one `engine.generate` call over every running completion: the request is the prompt followed by
the completion's tokens so far (token ids, never re-tokenised text), so the engine prefills the partial
completion under its current weights and samples at most `segment_tokens` more. Each round's tokens form a
segment tagged with the weight version that sampled it, and keep their sampling (behaviour) logprobs; a
completion's staleness when trained is the trainer's version minus its oldest segment's. What one rollout is comes
from its kind (grpo_fast.rollout.generation.Rollouts): after each round the kind ends every rollout whose turn
stopped or ran out of tokens, or (multi-turn) runs its tool calls, appends their results and lets it go on.

Staleness is bounded exactly: a step at version v trains only groups whose every completion started at a
version >= v - max_staleness. Older completions are restarted from their prompt (`stale: restart`) or their
group is dropped (`stale: drop`), both counted. A group is handed out only when all G completions are
done: group-relative advantages need the whole group. Which complete groups a step trains is `hand_out`: the oldest
first, the freshest first, or the oldest while the trained tokens of older weights stay within `stale_token_share`
(benchmarks/NOTES.md measures them).

In-flight state is plain data (`state_dict`): a checkpoint keeps it, so a resumed run continues the same
completions; a multi-turn rollout under way, whose environment is not plain data, starts again from its row.

With several ranks (torchrun) every rank holds the same pool: each round's requests are split into contiguous
shares, each rank generates its share with its own engine (request i seeded as in one process), and every rank
receives every output, so the pools stay equal, the ranks agree on when a step has its groups, and the
checkpoint is the one process's. The trainer then gives each rank its share of the step's groups.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from grpo_fast.config_fields import ConfigSection, option
from grpo_fast.distributed.context import Distributed
from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec, ToolEpisode
from grpo_fast.rollout.generation import PartialCompletion, Rollouts, SingleTurn

ROUND_SEEDS = 1_000_003
"""Seeds per round: request i of round r is seeded seed + r * ROUND_SEEDS + i."""


@dataclass
class PartialOptions(ConfigSection):
    """Partial rollouts (`rollout.partial`, used when rollout.mode is partial)."""

    key = "rollout.partial"
    segment_tokens: int = option(
        64, "tokens a completion may grow per generation round, before the step counts its complete groups", low=1
    )
    groups_in_flight: float = option(
        2.0, "groups kept generating, as a multiple of the step's prompts (over-provisioning)", low=1
    )
    max_rounds: int = option(
        256, "generation rounds per step at most (then the step trains what is complete, at least one group)", low=1
    )
    correction: Literal["decoupled", "coupled", "mask", "none"] = option(
        "decoupled",
        "for tokens of older weights: decoupled (the ratio against the trainer's weights before the update, times the "
        "truncated weight pi_prox / pi_behaviour, AReaL), coupled (the ratio against the behaviour logprobs), mask "
        "(no loss on tokens older than mask_staleness versions, slime), none",
    )
    mask_staleness: int = option(0, "correction mask: tokens at most this many versions old keep their loss", low=0)
    hand_out: Literal["oldest", "freshest", "bounded"] = option(
        "freshest",
        "which complete groups a step trains: oldest (started first), freshest (completed last, the earlier started "
        "first among those: a group that waited stays behind and restarts past max_staleness), bounded (the oldest "
        "while the share of trained tokens from older weights stays within stale_token_share, the freshest after)",
    )
    stale_token_share: float = option(
        0.5, "hand_out bounded: the share of a step's trained tokens that may come from older weights", low=0, high=1
    )


@dataclass
class PartialGroup:
    """G completions of one prompt (`row`: its dataset row; `data`: the row itself for kinds that read it, else
    None), generated round by round; `completed`, the weight version of the round that finished its last one."""

    row: int
    prompt_ids: list[int]
    members: list[PartialCompletion]
    data: dict | None = None
    completed: int | None = None

    @property
    def done(self) -> bool:
        return not any(m.running for m in self.members)

    def oldest_version(self, default: int) -> int:
        return min(m.oldest_version(default) for m in self.members)

    def tokens_by_age(self, version: int) -> tuple[int, int]:
        """(sampled tokens of weights older than `version`, sampled tokens) of its completions."""
        stale = total = 0
        for m in (m for m in self.members if m.segments):
            ends = [start for start, _ in m.segments[1:]] + [len(m.token_ids)]
            for (start, v), end in zip(m.segments, ends, strict=True):
                n = sum(m.sampled[start:end]) if m.sampled else end - start
                total += n
                stale += n if v < version else 0
        return stale, total


class PartialRollouts:
    """The groups under way between steps, and the round loop that advances them (see module doc).

    sampling(max_tokens, seed) -> the SamplingSpec of one round's requests (n = 1 each); max_completion_length:
    tokens per completion at most; max_staleness, stale ("restart" | "drop"): the bound and what happens beyond it;
    dist: the ranks that generate each round together (see module doc); kind: what one rollout is (default: single
    turn)."""

    def __init__(
        self,
        options: PartialOptions,
        num_generations: int,
        max_completion_length: int,
        max_staleness: int,
        stale: str,
        sampling: Callable[[int, int], SamplingSpec],
        dist: Distributed | None = None,
        kind: Rollouts | None = None,
    ) -> None:
        if stale not in ("restart", "drop"):
            raise ValueError(f"rollout.stale: expected 'restart' or 'drop', got {stale!r}")
        self.options, self.g, self.max_len = options, num_generations, max_completion_length
        self.max_staleness, self.stale, self.sampling = max_staleness, stale, sampling
        self.dist = dist or Distributed()
        self.kind = kind or SingleTurn(None)
        self.groups: list[PartialGroup] = []  # in the order they started
        # Rounds per step at least, so that a completion started in a step can reach the length limit within
        # max_staleness steps: without them a step that finds its groups in one round starves the long
        # completions, which are then restarted at the bound again and again and never trained.
        self.min_rounds = math.ceil(max_completion_length / (options.segment_tokens * max(max_staleness, 1)))

    def collect(
        self,
        engine: RolloutEngine,
        version: int,
        needed: int,
        draw: Callable[[int], list[tuple]],
        seed: int,
        first_round: int = 0,
        multiple_of: int | None = None,
    ) -> tuple[list[PartialGroup], Counter]:
        """Runs rounds at weight `version` until `needed` groups are complete and `min_rounds` rounds have run (or
        options.max_rounds rounds; then what is complete, drawing on rounds past the limit until at least
        `multiple_of` groups are) and hands out complete ones (options.hand_out), a multiple of `multiple_of`
        (default: the ranks' number) of them.

        draw(k) -> k new (row, prompt ids[, row data]) to start; seed: the step's base seed (round r's requests: seed
        + (first_round + r) * ROUND_SEEDS + i; a step's later call counts on from its earlier calls' rounds).
        Returns (groups, counts): counts "rounds", "restarted", "dropped", "started", "generated_tokens",
        "tool_seconds"."""
        counts: Counter = Counter()
        self.enforce_staleness(version, counts)
        target = max(needed, math.ceil(self.options.groups_in_flight * needed))
        multiple = multiple_of or self.dist.world_size
        rounds = 0
        while rounds < self.min_rounds or sum(g.done for g in self.groups) < needed:
            if rounds >= self.options.max_rounds and sum(g.done for g in self.groups) >= multiple:
                break
            counts["started"] += self.start(draw(max(0, target - len(self.groups))))
            self.round(engine, version, seed + (first_round + rounds) * ROUND_SEEDS, counts)
            rounds += 1
        counts["rounds"] = rounds
        done = min(needed, sum(g.done for g in self.groups))
        return self.take_done(done - done % multiple, version), counts

    def start(self, drawn: list[tuple]) -> int:
        """Starts a group of G rollouts for each drawn (row, prompt ids[, row data]); returns how many."""
        for row, prompt_ids, *data in drawn:
            data = data[0] if data else None
            self.groups.append(PartialGroup(row, prompt_ids, self.kind.begin(row, data, prompt_ids, self.g), data))
        return len(drawn)

    def take_done(self, limit: int, version: int) -> list[PartialGroup]:
        """Removes and returns `limit` complete groups at most, chosen by options.hand_out for weight `version`; what
        they hold (environment instances) goes back to the kind."""
        ready = self._choose([g for g in self.groups if g.done], limit, version)
        taken = {id(g) for g in ready}
        self.groups = [g for g in self.groups if id(g) not in taken]
        self.kind.release([m for g in ready for m in g.members])
        return ready

    def _choose(self, done: list[PartialGroup], limit: int, version: int) -> list[PartialGroup]:
        """`limit` of the complete groups `done` (in the order they started) by options.hand_out (see module doc)."""
        if self.options.hand_out == "oldest":
            return done[:limit]
        ages = {id(g): g.tokens_by_age(version) for g in done}
        # completed last first, the earlier started first among those completed alike (a checkpoint of before
        # `completed` was kept: the oldest token's version stands in)
        freshest = sorted(done, key=lambda g: -(g.oldest_version(version) if g.completed is None else g.completed))
        if self.options.hand_out == "freshest":
            return freshest[:limit]
        fresh = [g for g in freshest if ages[id(g)][0] == 0]
        stale = [g for g in done if ages[id(g)][0] > 0]  # oldest first
        fewest = max(0, limit - len(fresh))  # stale groups the batch needs however old they are
        for k in range(min(limit, len(stale)), fewest - 1, -1):  # as many of the oldest as the share allows
            chosen = stale[:k] + fresh[: limit - k]
            old, total = (sum(ages[id(g)][i] for g in chosen) for i in (0, 1))
            if old <= self.options.stale_token_share * max(total, 1):
                return chosen
        return stale[:fewest] + fresh[: limit - fewest]

    def enforce_staleness(self, version: int, counts: Counter) -> None:
        """Restarts (or drops the group of) every completion sampled in part by weights older than
        version - max_staleness."""
        oldest_allowed = version - self.max_staleness
        kept = []
        for group in self.groups:
            stale = [i for i, m in enumerate(group.members) if m.oldest_version(version) < oldest_allowed]
            if not stale:
                kept.append(group)
            elif self.stale == "drop":
                self.kind.release(group.members)
                counts["dropped"] += 1
            else:
                self.restart(group, stale)
                counts["restarted"] += len(stale)
                kept.append(group)
        self.groups = kept

    def restart(self, group: PartialGroup, members: list[int]) -> None:
        """Members `members` of `group` back to their prompt: every token will come from the current weights."""
        self.kind.release([group.members[i] for i in members])
        fresh = self.kind.begin(group.row, group.data, group.prompt_ids, len(members))
        for i, member in zip(members, fresh, strict=True):
            group.members[i] = member
        group.completed = None

    def round(self, engine: RolloutEngine, version: int, seed: int, counts: Counter) -> None:
        """One generate call over every running completion: prompt + tokens so far, at most segment_tokens more;
        then the kind takes those whose turn ended. Adds the "generated_tokens" and "tool_seconds" to `counts`."""
        running = [(g, m) for g in self.groups for m in g.members if m.running]
        if not running:
            return
        by_budget: dict[int, list[int]] = {}
        for i, (_, m) in enumerate(running):
            budget = min(self.options.segment_tokens, self.kind.budget(m, self.max_len))
            by_budget.setdefault(budget, []).append(i)
        ended, offset = [], 0
        going = [g for g in self.groups if not g.done]
        for budget, members in sorted(by_budget.items()):  # one call per budget: a few near the limit
            prompts = [(m.prompt_ids or g.prompt_ids) + m.token_ids for g, m in (running[i] for i in members)]
            outputs = self.generate(engine, prompts, budget, seed + offset)
            offset += len(members)
            for i, out in zip(members, outputs, strict=True):
                m = running[i][1]
                stopped = m.extend(out, budget, version)
                counts["generated_tokens"] += min(len(out.token_ids), budget)
                if stopped or self.kind.budget(m, self.max_len) <= 0:
                    ended.append((m, stopped))
        counts["tool_seconds"] += self.kind.end_turns(ended)
        for group in going:
            group.completed = version if group.done else None

    def generate(self, engine: RolloutEngine, prompts: list[list[int]], max_tokens: int, seed: int) -> list[Completion]:
        """One completion of at most `max_tokens` for each of `prompts` (request i seeded seed + i): each rank
        generates its contiguous share and every rank receives them all, in order."""
        lo, hi = (len(prompts) * r // self.dist.world_size for r in (self.dist.rank, self.dist.rank + 1))
        mine = []
        if hi > lo or engine.lockstep:  # a lockstep engine's generate is a collective of its ranks
            mine = [c for (c,) in engine.generate(prompts[lo:hi], self.sampling(max_tokens, seed + lo))]
        return [c for share in self.dist.all_gather(mine) for c in share]

    def digest(self) -> int:
        """A checksum of the pool's rows and completions' lengths, ends and last tokens: equal on every rank."""
        ends = [[(g.row, len(m.token_ids), m.token_ids[-1:], m.finish_reason) for m in g.members] for g in self.groups]
        return zlib.crc32(repr(ends).encode())

    def state_dict(self) -> dict:
        """The groups under way, as plain data (for a checkpoint)."""
        return {"groups": [self.group_state(g) for g in self.groups]}

    def load_state_dict(self, state: dict) -> None:
        """The groups of `state_dict`; a multi-turn rollout under way restarts, and so does a finished one with an
        environment (an environment instance is not saved: its reward functions would read None)."""
        self.groups = [self.group_from_state(g) for g in state["groups"]]
        with_environments = self.kind.environments is not None
        for group in self.groups:
            lost = [m.episode is not None and (m.running or with_environments) for m in group.members]
            self.restart(group, [i for i, restart in enumerate(lost) if restart])

    @staticmethod
    def group_state(group: PartialGroup) -> dict:
        """A group as plain data (a checkpoint's, or what crosses a process boundary): its completions' tokens and
        what a multi-turn rollout's conversation recorded (never its environment instance)."""
        return {
            "row": group.row,
            "prompt_ids": list(group.prompt_ids),
            "data": group.data,
            "completed": group.completed,
            "members": [
                {
                    "token_ids": m.token_ids,
                    "logprobs": m.logprobs,
                    "segments": [list(s) for s in m.segments],
                    "finish_reason": m.finish_reason,
                    "sampled": m.sampled,
                    "prompt_ids": m.prompt_ids,
                    "turn_start": m.turn_start,
                    "episode": None if m.episode is None else _episode_state(m.episode),
                }
                for m in group.members
            ],
        }

    @staticmethod
    def group_from_state(state: dict) -> PartialGroup:
        members = [
            PartialCompletion(
                list(m["token_ids"]),
                list(m["logprobs"]),
                [tuple(s) for s in m["segments"]],
                m["finish_reason"],
                list(m.get("sampled", [])),
                m.get("prompt_ids"),
                m.get("turn_start", 0),
                None if m.get("episode") is None else ToolEpisode(**m["episode"]),
            )
            for m in state["members"]
        ]
        return PartialGroup(state["row"], list(state["prompt_ids"]), members, state.get("data"), state.get("completed"))


def _episode_state(episode: ToolEpisode) -> dict:
    """A tool episode as plain data: its conversation and counts, without the environment instance."""
    return {
        "messages": episode.messages,
        "calls": episode.calls,
        "failures": episode.failures,
        "turns": episode.turns,
        "tool_seconds": episode.tool_seconds,
        "environment_reward": episode.environment_reward,
        "environment_discarded": episode.environment_discarded,
    }

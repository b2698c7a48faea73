"""Partial rollouts: a step generates in rounds of a few tokens and stops as soon as it has the complete
groups it needs; the completions still running wait for a later step and continue there under that step's
weights, instead of the whole step waiting for its slowest completion.

A round is one `engine.generate` call over every running completion: the request is the prompt followed by
the completion's tokens so far (token ids, never re-tokenised text), so the engine prefills the partial
completion under its current weights and samples at most `segment_tokens` more. Each round's tokens form a
segment tagged with the weight version that sampled it, and keep their sampling (behaviour) logprobs; a
completion's staleness when trained is the trainer's version minus its oldest segment's.

Staleness is bounded exactly: a step at version v trains only groups whose every completion started at a
version >= v - max_staleness. Older completions are restarted from their prompt (`stale: restart`) or their
group is dropped (`stale: drop`), both counted. A group is handed out only when all G completions are
done: group-relative advantages need the whole group.

In-flight state is plain data (`state_dict`): a checkpoint keeps it, so a resumed run continues the same
completions.

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
from dataclasses import dataclass, field
from typing import Literal

from grpo_fast.config_fields import ConfigSection, option
from grpo_fast.distributed.context import Distributed
from grpo_fast.rollout.base import Completion, RolloutEngine, SamplingSpec

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


@dataclass
class PartialCompletion:
    """One completion under way: its tokens and behaviour logprobs so far, and `segments`, the
    (first token index, weight version) of each round that added tokens. finish_reason None: still running."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segments: list[tuple[int, int]] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def running(self) -> bool:
        return self.finish_reason is None

    def oldest_version(self, default: int) -> int:
        return self.segments[0][1] if self.segments else default

    def restart(self) -> None:
        """Back to the prompt: every token will come from the current weights."""
        self.token_ids, self.logprobs, self.segments, self.finish_reason = [], [], [], None

    def completion(self) -> Completion:
        """The completion so far, without its text: rewards score the decode of its whole ids in its prompt's
        context (grpo_fast.rollout.texts), never the rounds' texts joined."""
        return Completion(
            list(self.token_ids), list(self.logprobs), "", self.finish_reason or "length", segments=list(self.segments)
        )


@dataclass
class PartialGroup:
    """G completions of one prompt (`row`: its dataset row), generated round by round."""

    row: int
    prompt_ids: list[int]
    members: list[PartialCompletion]

    @property
    def done(self) -> bool:
        return not any(m.running for m in self.members)

    def oldest_version(self, default: int) -> int:
        return min(m.oldest_version(default) for m in self.members)


class PartialRollouts:
    """The groups under way between steps, and the round loop that advances them (see module doc).

    sampling(max_tokens, seed) -> the SamplingSpec of one round's requests (n = 1 each); max_completion_length:
    tokens per completion at most; max_staleness, stale ("restart" | "drop"): the bound and what happens beyond it;
    dist: the ranks that generate each round together (see module doc).
    """

    def __init__(
        self,
        options: PartialOptions,
        num_generations: int,
        max_completion_length: int,
        max_staleness: int,
        stale: str,
        sampling: Callable[[int, int], SamplingSpec],
        dist: Distributed | None = None,
    ) -> None:
        if stale not in ("restart", "drop"):
            raise ValueError(f"rollout.stale: expected 'restart' or 'drop', got {stale!r}")
        self.options, self.g, self.max_len = options, num_generations, max_completion_length
        self.max_staleness, self.stale, self.sampling = max_staleness, stale, sampling
        self.dist = dist or Distributed()
        self.groups: list[PartialGroup] = []  # oldest first: complete groups are handed out in this order
        # Rounds per step at least, so that a completion started in a step can reach the length limit within
        # max_staleness steps: without them a step that finds its groups in one round starves the long
        # completions, which are then restarted at the bound again and again and never trained.
        self.min_rounds = math.ceil(max_completion_length / (options.segment_tokens * max(max_staleness, 1)))

    def collect(
        self,
        engine: RolloutEngine,
        version: int,
        needed: int,
        draw: Callable[[int], list[tuple[int, list[int]]]],
        seed: int,
        first_round: int = 0,
        multiple_of: int | None = None,
    ) -> tuple[list[PartialGroup], Counter]:
        """Runs rounds at weight `version` until `needed` groups are complete and `min_rounds` rounds have run (or
        options.max_rounds rounds; then what is complete, drawing on rounds past the limit until at least
        `multiple_of` groups are) and hands out the oldest complete ones, a multiple of `multiple_of` (default: the
        ranks' number) of them.

        draw(k) -> k new (row, prompt ids) to start; seed: the step's base seed (round r's requests: seed +
        (first_round + r) * ROUND_SEEDS + i; a step's later call counts on from its earlier calls' rounds).
        Returns (groups, counts): counts "rounds", "restarted", "dropped", "started", "generated_tokens"."""
        counts: Counter = Counter()
        self.enforce_staleness(version, counts)
        target = max(needed, math.ceil(self.options.groups_in_flight * needed))
        multiple = multiple_of or self.dist.world_size
        rounds = 0
        while rounds < self.min_rounds or sum(g.done for g in self.groups) < needed:
            if rounds >= self.options.max_rounds and sum(g.done for g in self.groups) >= multiple:
                break
            counts["started"] += self.start(draw(max(0, target - len(self.groups))))
            counts["generated_tokens"] += self.round(engine, version, seed + (first_round + rounds) * ROUND_SEEDS)
            rounds += 1
        counts["rounds"] = rounds
        done = min(needed, sum(g.done for g in self.groups))
        return self.take_done(done - done % multiple), counts

    def start(self, drawn: list[tuple[int, list[int]]]) -> int:
        """Starts a group of G completions for each drawn (row, prompt ids); returns how many."""
        self.groups += [PartialGroup(row, ids, [PartialCompletion() for _ in range(self.g)]) for row, ids in drawn]
        return len(drawn)

    def take_done(self, limit: int) -> list[PartialGroup]:
        """Removes and returns the oldest complete groups, `limit` at most."""
        ready = [g for g in self.groups if g.done][:limit]
        taken = {id(g) for g in ready}
        self.groups = [g for g in self.groups if id(g) not in taken]
        return ready

    def enforce_staleness(self, version: int, counts: Counter) -> None:
        """Restarts (or drops the group of) every completion sampled in part by weights older than
        version - max_staleness."""
        oldest_allowed = version - self.max_staleness
        kept = []
        for group in self.groups:
            stale = [m for m in group.members if m.oldest_version(version) < oldest_allowed]
            if not stale:
                kept.append(group)
            elif self.stale == "drop":
                counts["dropped"] += 1
            else:
                for m in stale:
                    m.restart()
                counts["restarted"] += len(stale)
                kept.append(group)
        self.groups = kept

    def round(self, engine: RolloutEngine, version: int, seed: int) -> int:
        """One generate call over every running completion: prompt + tokens so far, at most segment_tokens
        more. Returns the tokens generated."""
        running = [(g, m) for g in self.groups for m in g.members if m.running]
        if not running:
            return 0
        by_budget: dict[int, list[int]] = {}
        for i, (_, m) in enumerate(running):
            by_budget.setdefault(min(self.options.segment_tokens, self.max_len - len(m.token_ids)), []).append(i)
        generated, offset = 0, 0
        for budget, members in sorted(by_budget.items()):  # one call per budget: a few near the limit
            prompts = [running[i][0].prompt_ids + running[i][1].token_ids for i in members]
            outputs = self.generate(engine, prompts, budget, seed + offset)
            offset += len(members)
            for i, out in zip(members, outputs, strict=True):
                m = running[i][1]
                if out.token_ids and (not m.segments or m.segments[-1][1] != version):
                    m.segments.append((len(m.token_ids), version))
                m.token_ids += out.token_ids
                m.logprobs += out.logprobs if len(out.logprobs) == len(out.token_ids) else [0.0] * len(out.token_ids)
                generated += len(out.token_ids)
                if out.finish_reason == "stop":
                    m.finish_reason = "stop"
                elif len(m.token_ids) >= self.max_len:
                    m.finish_reason = "length"
        return generated

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
        self.groups = [self.group_from_state(g) for g in state["groups"]]

    @staticmethod
    def group_state(group: PartialGroup) -> dict:
        """A group as plain data (a checkpoint's, or what crosses a process boundary)."""
        return {
            "row": group.row,
            "prompt_ids": list(group.prompt_ids),
            "members": [
                {
                    "token_ids": m.token_ids,
                    "logprobs": m.logprobs,
                    "segments": [list(s) for s in m.segments],
                    "finish_reason": m.finish_reason,
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
            )
            for m in state["members"]
        ]
        return PartialGroup(state["row"], list(state["prompt_ids"]), members)

"""The rollout phase of a step: sample prompts, generate G completions each, score them, and (DAPO's
dynamic sampling) replace groups whose rewards are all equal. Returns a `RolloutBatch`.

The run's scheduler (grpo_fast.rollout.contract, rollout.mode) decides where a step's first groups and their
replacements come from: generated whole (sync), complete groups of the partial rollouts under way (partial), or of
the engine process (async). Whatever their source, groups are scored as they come and dynamic sampling
(`_dynamic_sampling`) chooses among them the same way.

Scoring can overlap generation: a round's prompts are generated in `reward.overlap_chunks` chunks, and
each chunk goes to the reward pool as soon as it exists, so the pool scores chunk k while the engine
generates chunk k + 1. Only the scoring of the last chunk (and in-process functions) stays on the
critical path; the step metrics report both that time and the pool's own. Each extra chunk is an extra
engine call, which costs more than cheap rewards take to score: with `overlap_chunks: auto` a round is
generated in one call, and in two from the next round on while the pool's work on the last round (the
workers' time in calls of the functions still pooled: cheap ones move in-process after one batch,
grpo_fast.rewards.reward_set) came to at least OVERLAP_SHARE of its generation time (each change is logged)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from grpo_fast.core.scoring import submit_completions
from grpo_fast.distributed.context import Distributed
from grpo_fast.rewards.length import soft_overlong_penalty
from grpo_fast.rewards.reward_set import PendingScores, RewardSet, ScoredBatch, TrainerState
from grpo_fast.rollout.async_rollouts import AsyncRollouts, EngineSpec
from grpo_fast.rollout.base import Completion, RolloutEngine
from grpo_fast.rollout.generation import Rollouts, SingleTurn
from grpo_fast.rollout.partial import PartialGroup, PartialRollouts
from grpo_fast.rollout.prompts import PromptEncoder, training_sampling
from grpo_fast.rollout.texts import CompletionTexts
from grpo_fast.trainer.advantages import group_advantages
from grpo_fast.trainer.config import TrainConfig
from grpo_fast.trainer.data_sampler import PromptSampler

logger = logging.getLogger(__name__)

ROUND_COUNTS = ("rounds", "started", "restarted", "dropped", "generated_tokens")
"""What a partial step counts (PartialRollouts.collect), each logged as rollout/<name> every step, 0 included."""
ENGINE_COUNTS = ("started", "restarted", "dropped", "dropped_stale", "generated_tokens", "busy_seconds", "idle_seconds")
"""What an async step counts (the engine process's, and the groups that arrived too old), logged the same way."""

OVERLAP_SHARE = 0.25
"""reward.overlap_chunks auto: split generation in two while the reward pool's work on the last round came to at least
this share of the round's generation time (the hidden share, up to half the pool's time, must beat the cost of
one more engine call: 16 ms on a 22 ms round of the demo's tiny model)."""
AUTO_CHUNKS = 2


@dataclass(frozen=True)
class RolloutBatch:
    """One step's training batch: B groups of G completions, group by group.

    prompt_ids, completions, rewards: [B*G], the prompt of each completion, the completion, and its combined
    reward (NaN when no reward function could score it).
    generated, generated_rows, generated_rewards [M], generated_rewards_per_func [M, F]: every completion
    generated this step, kept or not (dynamic sampling may generate more than B groups), with the index of
    its dataset row, for the step's metrics and the audit trail.
    frac_zero_var_groups: generated groups whose rewards are all equal; frac_stuck_groups: those of them below the
    full reward (identical and not all right: no signal and nothing learned).
    reward_failures: "<function>/<kind>" -> count, kind one of rewards.reward_set.FAILURE_KINDS.
    time_score: scoring on the critical path; time_score_pool: the reward pool's own time (mostly overlapped).
    """

    prompt_ids: list[list[int]]
    completions: list[Completion]
    rewards: torch.Tensor
    generated: list[Completion]
    generated_rows: list[int]
    generated_rewards: torch.Tensor
    generated_rewards_per_func: torch.Tensor
    frac_zero_var_groups: float
    frac_stuck_groups: float
    resample_rounds: int
    time_generate: float
    time_score: float
    time_score_pool: float
    reward_failures: dict[str, int]
    version: int = 0
    time_tools: float = 0.0
    """Multi-turn rollouts: seconds of time_generate spent running tools."""
    partial_counts: dict[str, float] = field(default_factory=dict)
    """rollout.mode partial: the step's "rounds", and the completions "restarted" / groups "dropped" for
    staleness, groups "started", "generated_tokens" (grpo_fast.rollout.partial.PartialRollouts.collect); async:
    the engine process's since the last step, its "busy_seconds" and "idle_seconds", and the groups "dropped_stale"
    on arrival."""
    tokens_generated: float | None = None
    """Tokens the engine sampled in `seconds_generating` (this rank's share; None: those of `generated`, in
    time_generate). Partial and async steps hand out completions sampled over several steps and generate tokens of
    completions they do not hand out: the rate counts what was generated, not what was handed out."""
    seconds_generating: float | None = None
    """The seconds the engine generated `tokens_generated` in: async, the engine process's own time generating."""
    reward_logs: dict[str, list[float]] = field(default_factory=dict)
    """What the reward functions logged this step with `log_metric`, by name."""
    generated_extra: dict[str, list] = field(default_factory=dict)
    """What they logged with `log_extra`: columns [M], one value per completion of `generated` (None: not logged)."""


@dataclass(frozen=True)
class _Ahead:
    """rollout.mode async: the groups taken for the next step while this one trains (`states`, every rank's, with
    the engine's `counts` that came with them), and the scoring of this rank's first `mine` of them, under way."""

    states: list[dict]
    counts: dict
    mine: int
    pending: PendingScores | None


@dataclass
class _Group:
    """One prompt's G completions, scored: its dataset row, each completion's prompt ids and combined reward [G]."""

    row: int
    prompt_ids: list[list[int]]
    completions: list[Completion]
    rewards: torch.Tensor


@dataclass
class _Step:
    """What a step drew, whatever its scheduler: every group it scored in order (kept or not) with its per-function
    rewards, the seconds by phase ("generate", "score", "score_pool", "tools"), the reward failures, and the pool's or
    engine's counts."""

    drawn: list[_Group] = field(default_factory=list)
    scored: list[ScoredBatch] = field(default_factory=list)
    times: Counter = field(default_factory=Counter)
    counts: Counter = field(default_factory=Counter)

    def add(self, groups: list[_Group], scored: ScoredBatch) -> None:
        self.drawn += groups
        self.scored.append(scored)
        self.times.update(score=scored.seconds_critical, score_pool=scored.seconds_pool)


def _slice(items: list, needed: list[int], rank: int) -> list:
    """Rank `rank`'s items of `items` handed out in rank order, needed[r] to rank r (fewer at the end when short)."""
    start = sum(needed[:rank])
    return items[start : start + needed[rank]]


class RolloutPhase:
    """Generates and scores one step's batch from the training rows (see module doc)."""

    def __init__(
        self,
        config: TrainConfig,
        rows: list[dict],
        prompts: PromptEncoder,
        rewards: RewardSet,
        sampler: PromptSampler,
        stop_ids: tuple[int, ...],
        dist: Distributed | None = None,
        rollouts: Rollouts | None = None,
    ) -> None:
        self.config, self.rows, self.prompts, self.rewards, self.sampler = config, rows, prompts, rewards, sampler
        self.rollouts = rollouts or SingleTurn(prompts)  # the rollout kind
        self.scheduler = config.rollout.scheduler
        self.stop_ids = stop_ids
        self.texts = CompletionTexts(prompts.tokenizer)
        self.dist = dist or Distributed()
        self.auto_chunks = 1  # reward.overlap_chunks auto: the chunks of the next round
        r = config.rollout
        self.pool_kwargs = dict(
            options=r.partial,
            num_generations=r.num_generations,
            max_completion_length=r.max_completion_length,
            max_staleness=r.max_staleness,
            stale=r.stale,
        )
        self.partial = None
        if self.scheduler.rounds and not self.scheduler.engine_process:  # every rank holds the same pool
            sampling = lambda max_tokens, seed: training_sampling(r, stop_ids, 1, seed, max_tokens)  # noqa: E731
            self.partial = PartialRollouts(**self.pool_kwargs, sampling=sampling, dist=self.dist, kind=self.rollouts)
        self.remote: AsyncRollouts | None = None  # rollout.mode async: the engine process, rank 0's
        self.async_started = False
        self.ahead: _Ahead | None = None  # rollout.mode async: the next step's first groups, taken ahead

    def start_async(self, spec: EngineSpec, weights, step: int) -> None:
        """rollout.mode async, every rank: rank 0 starts the engine process from `weights` (the trainer's, (name,
        tensor) pairs; every rank iterates them, a sharded model's gathers being collectives) at weight version
        `step`; the prompt schedule counts from there."""
        cfg = self.config
        if self.dist.is_main:
            sampling = training_sampling(cfg.rollout, self.stop_ids, 1, None)
            self.remote = AsyncRollouts(
                cfg.rollout.async_engine, spec, self.pool_kwargs, sampling, cfg.run.seed * 1_000_003, weights, step
            )
            self.remote.sent = step * cfg.run.prompts_per_step  # the schedule's count before this step
        else:
            for _ in weights:
                pass
        self.dist.run_on_main(lambda: self.remote.start())  # its failure raised on every rank
        self.async_started = True

    def push_weights(self, weights, version: int) -> dict[str, float]:
        """rollout.mode async, every rank: the trainer's weights (iterated on every rank) to the engine process as
        `version`, once it holds the last ones (grpo_fast.rollout.async_rollouts.AsyncRollouts)."""
        waited = self.dist.run_on_main(lambda: self.remote.wait_for_engine())
        if self.remote is None:
            for _ in weights:
                pass
            return {"sync/wait_engine": waited}
        return {**self.remote.write_weights(weights, version), "sync/wait_engine": waited}

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()
            self.remote = None
        self.async_started = False
        self.ahead = None

    def collect(self, engine: RolloutEngine, step: int) -> RolloutBatch:
        """The step's batch at weight version `step` (the weights after `step` trainer steps): this rank's share of
        run.prompts_per_step groups, from the scheduler's source (see module doc), with grpo.dynamic_sampling's
        replacements."""
        step_data = _Step()
        if self.scheduler.engine_process:
            first, more = self._async_groups(step, step_data)
        elif self.scheduler.rounds:
            first, more = self._partial_groups(engine, step, step_data)
        else:
            first, more = self._sync_groups(engine, step, step_data)
        chosen, rounds = self._dynamic_sampling(first, more)
        return self._batch(chosen, rounds, step, step_data)

    def _sync_groups(self, engine: RolloutEngine, step: int, data: _Step) -> tuple[list[_Group], Callable]:
        """rollout.mode sync: this rank's groups generated whole, and `more(needed)` that generates more.

        Every rank holds the same prompt sampler. Each call, the ranks exchange how many groups each still
        needs, draw that many prompts in total, and each takes its slice in rank order; request i of the
        call (counted over all ranks) is seeded as in a single process, so the ranks together generate what
        one process would, split by rank."""
        cfg, g, calls = self.config, self.config.rollout.num_generations, [0]

        def more(needed: list[int]) -> list[_Group]:
            drawn = self.sampler.next(sum(needed))
            offset = sum(needed[: self.dist.rank])
            index = drawn[offset : offset + needed[self.dist.rank]]
            seed = (cfg.run.seed * 1_000_003 + step * 10_007 + calls[0] * 101) * 1000 + offset * g
            calls[0] += 1
            groups = self._generate_and_score(engine, index, seed, step, data)
            for c in (c for grp in groups for c in grp.completions):
                c.segments = [(0, step)]
            return groups

        return more(self.dist.all_gather_ints(cfg.run.prompts_per_step // self.dist.world_size)), more

    def _partial_groups(self, engine: RolloutEngine, step: int, data: _Step) -> tuple[list[_Group], Callable]:
        """rollout.mode partial: run.prompts_per_step complete groups from the partial rollouts under way
        (grpo_fast.rollout.partial), this rank's share of them (rank order) scored, and `more(needed)` that runs
        the pool on for more. The ranks' pools must be equal: a difference is an error here, not a collective that
        waits forever later."""
        cfg = self.config
        seed = (cfg.run.seed * 1_000_003 + step * 10_007) * 1000

        def pool_groups(needed: int, **kwargs) -> list[PartialGroup]:
            t0 = time.perf_counter()
            groups, counts = self.partial.collect(engine, step, needed, self._draw, seed, **kwargs)
            data.times.update(generate=time.perf_counter() - t0, tools=counts["tool_seconds"])
            data.counts.update(counts)
            self._check_pools(step)
            return groups

        groups = pool_groups(cfg.run.prompts_per_step)
        share = len(groups) // self.dist.world_size
        first = self._score(groups[self.dist.rank * share : (self.dist.rank + 1) * share], step, data)

        def more(needed: list[int]) -> list[_Group]:
            extra = pool_groups(sum(needed), first_round=data.counts["rounds"], multiple_of=1)
            return self._score(_slice(extra, needed, self.dist.rank), step, data)

        return first, more

    def _check_pools(self, step: int) -> None:
        """With several ranks: RuntimeError unless every rank's partial-rollout pool is the same."""
        if self.dist.enabled and len(set(self.dist.all_gather_ints(self.partial.digest()))) > 1:
            raise RuntimeError(f"rollout.mode partial: the ranks' partial rollouts differ after step {step}'s rounds")

    def _async_groups(self, step: int, data: _Step) -> tuple[list[_Group], Callable]:
        """rollout.mode async: run.prompts_per_step complete groups from the engine process, after sending the
        prompts the schedule has due (rank 0), each rank taking its share in rank order (the wait for them counts as
        generation), and `more(needed)` that asks the engine for more. The groups taken ahead during the last step
        come first, with their scores; before returning, the groups already waiting are taken ahead for the next
        step and their scoring starts, to run while this step trains."""
        want = self.config.run.prompts_per_step
        share = want // self.dist.world_size
        ahead, self.ahead = self.ahead or _Ahead([], {}, 0, None), None

        def fetch() -> tuple[list[dict], dict, float]:
            self.remote.send(self._draw(self.remote.prompts_due(step, want) - self.remote.sent))
            groups, counts, waited = self.remote.collect(want - len(ahead.states), step)
            return [PartialRollouts.group_state(g) for g in groups], dict(counts), waited

        def fetch_more(needed: list[int]) -> tuple[list[dict], dict]:
            self.remote.send(self._draw(sum(needed)), scheduled=False)  # the schedule's prompts stay ahead
            groups, extra_counts, _ = self.remote.collect(sum(needed), step)
            return [PartialRollouts.group_state(g) for g in groups], dict(extra_counts)

        def more(needed: list[int]) -> list[_Group]:
            t0 = time.perf_counter()
            extra, extra_counts = self.dist.run_on_main(lambda: fetch_more(needed))
            data.times["generate"] += time.perf_counter() - t0
            data.counts.update(extra_counts)
            groups = [PartialRollouts.group_from_state(s) for s in _slice(extra, needed, self.dist.rank)]
            return self._score(groups, step, data)

        states, counts, waited = self.dist.run_on_main(fetch)
        data.times["generate"] += waited
        data.counts.update(ahead.counts)
        data.counts.update(counts)
        data.counts["scored_ahead"] += ahead.mine
        first = self._score(self._my_share(ahead.states + states, share), step, data, ahead)
        data.times["score"] += self._take_ahead(step + 1, want, share)
        return first, more

    def _take_ahead(self, step: int, want: int, share: int) -> float:
        """rollout.mode async: the groups waiting now (up to a step's worth) become the start of `step`'s, and the
        scoring of this rank's share of them starts; -> the seconds this took (the in-process rewards' share)."""
        t0 = time.perf_counter()

        def take() -> tuple[list[dict], dict]:
            groups, counts = self.remote.take_ready(want, step)
            return [PartialRollouts.group_state(g) for g in groups], dict(counts)

        states, counts = self.dist.run_on_main(take)
        mine = self._my_share(states, share)
        pending = self._submit(mine, self._completions(mine), step) if mine else None
        self.ahead = _Ahead(states, counts, len(mine), pending)
        return time.perf_counter() - t0

    def _my_share(self, states: list[dict], share: int) -> list[PartialGroup]:
        """This rank's slice (rank order, `share` each) of the groups in `states`."""
        return [
            PartialRollouts.group_from_state(s) for s in states[self.dist.rank * share : (self.dist.rank + 1) * share]
        ]

    def _draw(self, k: int) -> list[tuple]:
        """k prompts from the sampler: (row, prompt ids) each, and the row itself for a kind that reads it."""
        index = self.sampler.next(k) if k > 0 else []
        ids = self.prompts.encode_rows(self.rows, index, cache=True)
        if self.rollouts.reads_rows:
            return [(i, p, self.rows[i]) for i, p in zip(index, ids, strict=True)]
        return list(zip(index, ids, strict=True))

    def _completions(self, groups: list[PartialGroup]) -> list[Completion]:
        """The completions of complete partial-rollout groups, group by group, each with the text of its whole ids
        decoded in its prompt's context (grpo_fast.rollout.texts: the rounds' pieces are never joined as text)."""
        completions = [m.completion() for grp in groups for m in grp.members]
        self.texts(_prompt_ids(groups), completions)
        return completions

    def _submit(self, groups: list[PartialGroup], completions: list[Completion], step: int) -> PendingScores:
        """Starts scoring complete partial-rollout groups (their `completions`) at weight version `step`."""
        rows = [self.rows[grp.row] for grp in groups for _ in range(self.config.rollout.num_generations)]
        state = TrainerState(global_step=step, max_steps=self.config.run.max_steps)
        return submit_completions(self.rewards, rows, completions, state)

    def _score(self, groups: list[PartialGroup], step: int, data: _Step, ahead: _Ahead | None = None) -> list[_Group]:
        """Complete partial-rollout groups scored at weight version `step` and recorded in `data`; the first
        `ahead.mine` of them were scored ahead (`ahead.pending`, its in-process share counted in the step that
        started it)."""
        g = self.config.rollout.num_generations
        completions, parts = self._completions(groups), []
        done = 0
        if ahead is not None and ahead.pending is not None:
            t0 = time.perf_counter()
            parts.append(dataclasses.replace(ahead.pending.result(), seconds_critical=time.perf_counter() - t0))
            done = ahead.mine
        if len(groups) > done:
            parts.append(self._submit(groups[done:], completions[done * g :], step).result())
        if not parts:
            return []
        scored = ScoredBatch.concat(parts)
        rewards = self._combined(scored.per_func, completions)
        prompt_ids = _prompt_ids(groups)
        out = [
            _Group(
                grp.row, prompt_ids[k * g : (k + 1) * g], completions[k * g : (k + 1) * g], rewards[k * g : (k + 1) * g]
            )
            for k, grp in enumerate(groups)
        ]
        data.add(out, scored)
        return out

    def _dynamic_sampling(self, first: list[_Group], more: Callable[[list[int]], list[_Group]]) -> tuple:
        """grpo.dynamic_sampling (DAPO), the one implementation for every scheduler: this rank's groups whose rewards
        are all equal make way for more, `more(needed)` (every rank's count of groups missing -> this rank's new
        ones, scored: a collective), for up to grpo.max_resample_rounds rounds; out of rounds, zero-variance groups
        fill the batch (advantage 0, they still count in dapo's normaliser). -> (the chosen groups, rounds)."""
        if not self.config.grpo.dynamic_sampling:
            return first, 0
        want = len(first)
        kept, spare = self._split_flat(first)
        rounds = 0
        while rounds < self.config.grpo.max_resample_rounds:
            needed = self.dist.all_gather_ints(want - len(kept))
            if not sum(needed):
                break
            new_kept, new_spare = self._split_flat(more(needed))
            kept, spare, rounds = kept + new_kept, spare + new_spare, rounds + 1
        return (kept + spare)[:want], rounds

    def _split_flat(self, groups: list[_Group]) -> tuple[list[_Group], list[_Group]]:
        """`groups` split into those whose rewards vary and those whose rewards are all equal."""
        if not groups:
            return [], []
        g = self.config.rollout.num_generations
        flat = group_advantages(torch.cat([grp.rewards for grp in groups]), g, "none")[1].tolist()
        return [x for x, f in zip(groups, flat, strict=True) if not f], [
            x for x, f in zip(groups, flat, strict=True) if f
        ]

    def _batch(self, chosen: list[_Group], rounds: int, step: int, data: _Step) -> RolloutBatch:
        """The step's RolloutBatch: the `chosen` groups, and every group the step drew for the metrics."""
        generated_rewards = torch.cat([grp.rewards for grp in data.drawn])
        generated_rows = [grp.row for grp in data.drawn for _ in grp.completions]
        zero_var, stuck = self._flat_groups(generated_rewards, generated_rows)
        rounds_kind = self.scheduler.rounds
        scored = ScoredBatch.concat(data.scored)
        return RolloutBatch(
            prompt_ids=[p for grp in chosen for p in grp.prompt_ids],
            completions=[c for grp in chosen for c in grp.completions],
            rewards=torch.cat([grp.rewards for grp in chosen]),
            generated=[c for grp in data.drawn for c in grp.completions],
            generated_rows=generated_rows,
            generated_rewards=generated_rewards,
            generated_rewards_per_func=scored.per_func,
            frac_zero_var_groups=zero_var,
            frac_stuck_groups=stuck,
            resample_rounds=rounds,
            time_generate=data.times["generate"],
            time_score=data.times["score"],
            time_score_pool=data.times["score_pool"],
            reward_failures=scored.failures,
            version=step,
            time_tools=data.times["tools"],
            partial_counts=self._step_counts(data.counts) if rounds_kind else {},
            # every rank counts every round's tokens; async: the engine process's own time generating
            tokens_generated=data.counts["generated_tokens"] / self.dist.world_size if rounds_kind else None,
            seconds_generating=(data.counts["busy_seconds"] if self.scheduler.engine_process else None),
            reward_logs=scored.logged_metrics,
            generated_extra=scored.extra,
        )

    def _step_counts(self, counts: Counter) -> dict[str, float]:
        """A partial or async step's counts, every one its scheduler keeps (0 where nothing happened)."""
        return {**dict.fromkeys(ENGINE_COUNTS if self.scheduler.engine_process else ROUND_COUNTS, 0.0), **counts}

    def _flat_groups(self, rewards: torch.Tensor, rows: list[int]) -> tuple[float, float]:
        """The shares of the groups in `rewards` [groups * G] (of dataset rows `rows`) whose rewards are all equal,
        and of those stuck: equal and not all at the full reward (no signal and nothing learned)."""
        g = self.config.rollout.num_generations
        _, zero_var = group_advantages(rewards, g, "none")
        full = self.rewards.full_rewards([self.rows[i] for i in rows])
        unsolved = ~(rewards.view(-1, g) >= full.view(-1, g) - 1e-6).all(dim=1)
        return float(zero_var.float().mean()), float((zero_var & unsolved).float().mean())

    def chunks(self, engine: RolloutEngine) -> int:
        """Engine calls per generation round (reward.overlap_chunks; "auto": `auto_chunks`); with a lockstep
        engine, the most any rank makes, so that every rank calls generate equally often."""
        setting = self.config.reward.overlap_chunks
        chunks = self.auto_chunks if setting == "auto" else setting
        return max(self.dist.all_gather_ints(chunks)) if engine.lockstep else chunks

    def _observe_round(self, engine: RolloutEngine, seconds_pool: float, seconds_generate: float) -> None:
        """reward.overlap_chunks auto: the next round's chunks from this round's generation time and what the
        pool's work on it would take with the functions pooled now (`RewardSet.pool_seconds`); always 1 with an
        engine that does not seed each request (its samples would follow the timing)."""
        worth = seconds_pool >= OVERLAP_SHARE * seconds_generate
        chunks = AUTO_CHUNKS if worth and engine.seeds_each_request else 1
        if self.config.reward.overlap_chunks == "auto" and chunks != self.auto_chunks:
            logger.info(
                "reward.overlap_chunks auto: %d generation call(s) per round from now on (the reward pool's calls "
                "need %.3f s against %.3f s of generation)",
                chunks,
                seconds_pool,
                seconds_generate,
            )
            self.auto_chunks = chunks

    def _generate_and_score(
        self, engine: RolloutEngine, index: list[int], seed: int, step: int, data: _Step
    ) -> list[_Group]:
        """G completions for each row of `index`, generated chunk by chunk while the previous chunk is scored, as
        groups with their combined rewards (the overlong penalty included); the seconds spent, the scores and the
        verifier failures recorded in `data`."""
        cfg, n = self.config, self.config.rollout.num_generations
        state = TrainerState(global_step=step, max_steps=cfg.run.max_steps)
        calls = self.chunks(engine)
        chunk = max(1, -(-len(index) // calls))
        starts = list(range(0, len(index), chunk))
        if engine.lockstep:  # every rank calls generate as often, empty-handed where it has no prompts
            starts += [len(index)] * (calls - len(starts))
        prompt_ids, flat, pending, generating = [], [], [], 0.0
        for start in starts:
            # Request i of the round keeps seed + i * n however the round is split.
            spec = training_sampling(cfg.rollout, self.stop_ids, n, seed + start * n)
            keys = index[start : start + chunk]
            rows = [self.rows[i] for i in keys]
            t0 = time.perf_counter()
            out = self.rollouts.generate(engine, rows, spec, keys)
            generating += time.perf_counter() - t0
            if not out.completions:
                continue
            rows = [row for row in rows for _ in range(n)]
            data.times["tools"] += out.seconds_tools
            pending.append(submit_completions(self.rewards, rows, out.completions, state, out.columns))
            prompt_ids += out.prompt_ids
            flat += out.completions
        data.times["generate"] += generating
        if not pending:  # this rank has its groups; the others resample
            return []
        scored = [p.result() for p in pending]
        self._observe_round(engine, sum(self.rewards.pool_seconds(s) for s in scored), generating)
        batch = ScoredBatch.concat(scored)
        rewards = self._combined(batch.per_func, flat)
        groups = [
            _Group(row, prompt_ids[k * n : (k + 1) * n], flat[k * n : (k + 1) * n], rewards[k * n : (k + 1) * n])
            for k, row in enumerate(index)
        ]
        data.add(groups, batch)
        return groups

    def _combined(self, per_func: torch.Tensor, completions: list[Completion]) -> torch.Tensor:
        """[N] the weighted sum of the [N, F] rewards, with DAPO's soft overlong penalty when it is on."""
        cfg = self.config
        rewards = self.rewards.combine(per_func)
        if cfg.grpo.overlong_buffer > 0:
            max_len, buffer, factor = (
                cfg.rollout.max_completion_length,
                cfg.grpo.overlong_buffer,
                cfg.grpo.overlong_penalty_factor,
            )
            penalties = [soft_overlong_penalty(len(c.token_ids), max_len, buffer, factor) for c in completions]
            rewards = rewards + torch.tensor(penalties)
        return rewards


def _prompt_ids(groups: list[PartialGroup]) -> list[list[int]]:
    """The prompt ids of each completion of `groups`: its own (an environment's reset adds to it) or its group's."""
    return [m.prompt_ids or grp.prompt_ids for grp in groups for m in grp.members]

"""The rollout phase of a step: sample prompts, generate G completions each, score them, and (DAPO's
dynamic sampling) replace groups whose rewards are all equal. Returns a `RolloutBatch`.

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


@dataclass(frozen=True)
class _Ahead:
    """rollout.mode async: the groups taken for the next step while this one trains (`states`, every rank's, with
    the engine's `counts` that came with them), and the scoring of this rank's first `mine` of them, under way."""

    states: list[dict]
    counts: dict
    mine: int
    pending: PendingScores | None


@dataclass
class _Drawn:
    """Every completion a partial / async step scored (the batch's and, with grpo.dynamic_sampling, the
    replacements'), in order: their dataset rows, scores and combined rewards, for the step's metrics."""

    completions: list[Completion]
    rows: list[int]
    scored: list[ScoredBatch]
    rewards: list[torch.Tensor]

    def add(self, completions: list[Completion], rows: list[int], scored: ScoredBatch, rewards: torch.Tensor) -> None:
        self.completions += completions
        self.rows += rows
        self.scored.append(scored)
        self.rewards.append(rewards)


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
        self.rollouts = rollouts or SingleTurn(prompts)  # how a sync step's completions are produced
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
        if r.mode == "partial":  # with several ranks, every rank holds the same pool (grpo_fast.rollout.partial)
            sampling = lambda max_tokens, seed: training_sampling(r, stop_ids, 1, seed, max_tokens)  # noqa: E731
            self.partial = PartialRollouts(**self.pool_kwargs, sampling=sampling, dist=self.dist)
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
        """The step's batch at weight version `step` (the weights after `step` updates): rollout.mode partial
        in `_collect_partial`, else this rank's share, run.prompts_per_step / world_size groups, generated whole.

        Every rank holds the same prompt sampler. Each round, the ranks exchange how many groups each still
        needs, draw that many prompts in total, and each takes its slice in rank order; request i of the
        round (counted over all ranks) is seeded as in a single process, so the ranks together generate what
        one process would, split by rank."""
        if self.async_started:
            return self._collect_async(step)
        if self.partial is not None:
            return self._collect_partial(engine, step)
        cfg, g = self.config, self.config.rollout.num_generations
        want = cfg.run.prompts_per_step // self.dist.world_size
        kept, spare, generated, generated_rows, rewards_all, per_func_all = [], [], [], [], [], []
        times, failures = Counter(), Counter()
        rounds = 0
        while True:
            needed = self.dist.all_gather_ints(want - len(kept))
            if not sum(needed):
                break
            drawn = self.sampler.next(sum(needed))
            offset = sum(needed[: self.dist.rank])
            index = drawn[offset : offset + needed[self.dist.rank]]
            seed = (cfg.run.seed * 1_000_003 + step * 10_007 + rounds * 101) * 1000 + offset * g
            prompt_ids, flat, per_func, rewards = self._generate_and_score(engine, index, seed, step, times, failures)
            generated += flat
            generated_rows += [i for i in index for _ in range(g)]
            rewards_all.append(rewards)
            per_func_all.append(per_func)
            for k in range(len(index)):
                group = (prompt_ids[k * g : (k + 1) * g], flat[k * g : (k + 1) * g], rewards[k * g : (k + 1) * g])
                if cfg.grpo.dynamic_sampling and bool(group_advantages(group[2], g, "none")[1].all()):
                    spare.append(group)
                else:
                    kept.append(group)
            if not cfg.grpo.dynamic_sampling or rounds >= cfg.grpo.max_resample_rounds:
                break
            rounds += 1
        # Out of rounds: fill up with zero-variance groups (advantage 0, they still count in dapo's normaliser).
        kept = (kept + spare)[:want]
        for c in generated:
            c.segments = [(0, step)]
        generated_rewards = torch.cat(rewards_all)
        zero_var, stuck = self._flat_groups(generated_rewards, generated_rows)
        return RolloutBatch(
            prompt_ids=[p for ps, _, _ in kept for p in ps],
            completions=[c for _, cs, _ in kept for c in cs],
            rewards=torch.cat([r for _, _, r in kept]),
            generated=generated,
            generated_rows=generated_rows,
            generated_rewards=generated_rewards,
            generated_rewards_per_func=torch.cat(per_func_all),
            frac_zero_var_groups=zero_var,
            frac_stuck_groups=stuck,
            resample_rounds=rounds,
            time_generate=times["generate"],
            time_score=times["score"],
            time_score_pool=times["score_pool"],
            reward_failures=dict(failures),
            version=step,
            time_tools=times["tools"],
        )

    def _collect_partial(self, engine: RolloutEngine, step: int) -> RolloutBatch:
        """run.prompts_per_step complete groups from the partial rollouts under way (grpo_fast.rollout.partial),
        this rank's share of them (rank order) scored once complete. The ranks' pools must be equal: a difference
        is an error here, not a collective that waits forever later."""
        cfg = self.config
        seed = (cfg.run.seed * 1_000_003 + step * 10_007) * 1000
        t0 = time.perf_counter()
        groups, counts = self.partial.collect(engine, step, cfg.run.prompts_per_step, self._draw, seed)
        self._check_pools(step)
        share = len(groups) // self.dist.world_size
        mine = groups[self.dist.rank * share : (self.dist.rank + 1) * share]

        def more(needed: list[int]) -> list[PartialGroup]:
            extra, extra_counts = self.partial.collect(
                engine, step, sum(needed), self._draw, seed, first_round=counts["rounds"], multiple_of=1
            )
            counts.update(extra_counts)
            self._check_pools(step)
            return _slice(extra, needed, self.dist.rank)

        return self._scored(mine, step, counts, time.perf_counter() - t0, more=more)

    def _check_pools(self, step: int) -> None:
        """With several ranks: RuntimeError unless every rank's partial-rollout pool is the same."""
        if self.dist.enabled and len(set(self.dist.all_gather_ints(self.partial.digest()))) > 1:
            raise RuntimeError(f"rollout.mode partial: the ranks' partial rollouts differ after step {step}'s rounds")

    def _collect_async(self, step: int) -> RolloutBatch:
        """run.prompts_per_step complete groups from the engine process, after sending the prompts the schedule
        has due (rank 0), each rank taking its share in rank order; time_generate is the wait for them. The groups
        taken ahead during the last step come first, with their scores; before returning, the groups already
        waiting are taken ahead for the next step and their scoring starts, to run while this step trains."""
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

        def more(needed: list[int]) -> list[PartialGroup]:
            extra, extra_counts = self.dist.run_on_main(lambda: fetch_more(needed))
            counts.update(extra_counts)
            return [PartialRollouts.group_from_state(s) for s in _slice(extra, needed, self.dist.rank)]

        states, counts, waited = self.dist.run_on_main(fetch)
        states = ahead.states + states
        mine = self._my_share(states, share)
        counts = Counter(ahead.counts) + Counter(counts) + Counter(scored_ahead=ahead.mine)
        take_seconds = self._take_ahead(step + 1, want, share)
        return self._scored(mine, step, counts, waited, ahead, take_seconds, more=more)

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

    def _completions(self, groups: list[PartialGroup]) -> list[Completion]:
        """The completions of complete partial-rollout groups, group by group, each with the text of its whole ids
        decoded in its prompt's context (grpo_fast.rollout.texts: the rounds' pieces are never joined as text)."""
        completions = [m.completion() for grp in groups for m in grp.members]
        self.texts([grp.prompt_ids for grp in groups for _ in grp.members], completions)
        return completions

    def _my_share(self, states: list[dict], share: int) -> list[PartialGroup]:
        """This rank's slice (rank order, `share` each) of the groups in `states`."""
        return [
            PartialRollouts.group_from_state(s) for s in states[self.dist.rank * share : (self.dist.rank + 1) * share]
        ]

    def _draw(self, k: int) -> list[tuple[int, list[int]]]:
        """k prompts from the sampler: (row, prompt ids) each."""
        index = self.sampler.next(k) if k > 0 else []
        return list(zip(index, self.prompts.encode_rows(self.rows, index, cache=True), strict=True))

    def _submit(self, groups: list[PartialGroup], completions: list[Completion], step: int) -> PendingScores:
        """Starts scoring complete partial-rollout groups (their `completions`) at weight version `step`."""
        rows = [self.rows[grp.row] for grp in groups for _ in range(self.config.rollout.num_generations)]
        state = TrainerState(global_step=step, max_steps=self.config.run.max_steps)
        return submit_completions(self.rewards, rows, completions, state)

    def _scored(
        self,
        groups: list[PartialGroup],
        step: int,
        counts: Counter,
        seconds: float,
        ahead: _Ahead | None = None,
        seconds_ahead: float = 0.0,
        more: Callable[[list[int]], list[PartialGroup]] | None = None,
    ) -> RolloutBatch:
        """The batch of complete partial-rollout groups, scored; `seconds` of generation (or of waiting for it).
        The first `ahead.mine` groups were scored ahead (`ahead.pending`); `seconds_ahead`: the scoring started
        ahead for the next step, counted in this step's scoring time. With grpo.dynamic_sampling, `more` replaces
        the zero-variance groups (`_resample`)."""
        g = self.config.rollout.num_generations
        completions = self._completions(groups)
        parts = []
        if ahead is not None and ahead.pending is not None:
            t0 = time.perf_counter()
            head = ahead.pending.result()  # its in-process share was counted in the step that started it
            parts.append(dataclasses.replace(head, seconds_critical=time.perf_counter() - t0))
        done = ahead.mine if ahead is not None else 0
        if len(groups) > done:
            parts.append(self._submit(groups[done:], completions[done * g :], step).result())
        scored = ScoredBatch.concat(parts)
        rewards = self._combined(scored.per_func, completions)
        drawn = _Drawn([], [], [], [])
        drawn.add(completions, [grp.row for grp in groups for _ in range(g)], scored, rewards)
        rounds, seconds_more = 0, 0.0
        if self.config.grpo.dynamic_sampling and more is not None:
            groups, completions, rewards, rounds, seconds_more = self._resample(
                groups, completions, rewards, more, step, drawn
            )
        every = ScoredBatch.concat(drawn.scored)
        generated_rewards = torch.cat(drawn.rewards)
        zero_var, stuck = self._flat_groups(generated_rewards, drawn.rows)
        return RolloutBatch(
            prompt_ids=[grp.prompt_ids for grp in groups for _ in range(g)],
            completions=completions,
            rewards=rewards,
            generated=drawn.completions,
            generated_rows=drawn.rows,
            generated_rewards=generated_rewards,
            generated_rewards_per_func=every.per_func,
            frac_zero_var_groups=zero_var,
            frac_stuck_groups=stuck,
            resample_rounds=rounds,
            time_generate=seconds + seconds_more,
            time_score=every.seconds_critical + seconds_ahead,
            time_score_pool=every.seconds_pool,
            reward_failures=dict(every.failures),
            version=step,
            partial_counts=dict(counts),
            tokens_generated=counts["generated_tokens"] / self.dist.world_size,  # every rank counts every round's
            seconds_generating=counts["busy_seconds"] if self.async_started else seconds + seconds_more,
        )

    def _resample(
        self,
        groups: list[PartialGroup],
        completions: list[Completion],
        rewards: torch.Tensor,
        more: Callable[[list[int]], list[PartialGroup]],
        step: int,
        drawn: _Drawn,
    ) -> tuple[list[PartialGroup], list[Completion], torch.Tensor, int, float]:
        """grpo.dynamic_sampling (DAPO) over complete groups: this rank's groups whose rewards [len(groups) * G]
        are all equal make way for more, `more(needed)` (every rank's count of groups missing -> this rank's new
        ones: a collective), scored as they come (recorded in `drawn`), for up to grpo.max_resample_rounds rounds;
        out of rounds, zero-variance groups fill the batch, as in sync mode. -> (groups, their completions and
        rewards, rounds, seconds spent getting more)."""
        g, want = self.config.rollout.num_generations, len(groups)
        kept, spare = self._split_flat(groups, completions, rewards)
        rounds, seconds = 0, 0.0
        while rounds < self.config.grpo.max_resample_rounds:
            needed = self.dist.all_gather_ints(want - len(kept))
            if not sum(needed):
                break
            t0 = time.perf_counter()
            new = more(needed)
            seconds += time.perf_counter() - t0
            rounds += 1
            if new:
                completions = self._completions(new)
                scored = self._submit(new, completions, step).result()
                new_rewards = self._combined(scored.per_func, completions)
                drawn.add(completions, [grp.row for grp in new for _ in range(g)], scored, new_rewards)
                new_kept, new_spare = self._split_flat(new, completions, new_rewards)
                kept, spare = kept + new_kept, spare + new_spare
        chosen = (kept + spare)[:want]
        return (
            [grp for grp, _, _ in chosen],
            [c for _, cs, _ in chosen for c in cs],
            torch.cat([r for _, _, r in chosen]),
            rounds,
            seconds,
        )

    def _split_flat(self, groups: list[PartialGroup], completions: list[Completion], rewards: torch.Tensor) -> tuple:
        """(group, its G completions, its G rewards) of each of `groups`: those whose rewards vary, and those whose
        rewards are all equal."""
        g = self.config.rollout.num_generations
        flat = group_advantages(rewards, g, "none")[1].tolist()
        split = [completions[i * g : (i + 1) * g] for i in range(len(groups))]
        triples = list(zip(groups, split, rewards.view(-1, g), strict=True))
        varied = [t for t, f in zip(triples, flat, strict=True) if not f]
        return varied, [t for t, f in zip(triples, flat, strict=True) if f]

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

    def _observe_round(self, seconds_pool: float, seconds_generate: float) -> None:
        """reward.overlap_chunks auto: the next round's chunks from this round's generation time and what the
        pool's work on it would take with the functions pooled now (`RewardSet.pool_seconds`)."""
        chunks = AUTO_CHUNKS if seconds_pool >= OVERLAP_SHARE * seconds_generate else 1
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
        self, engine: RolloutEngine, index: list[int], seed: int, step: int, times: Counter, failures: Counter
    ):
        """G completions for each row of `index`, generated chunk by chunk while the previous chunk is
        scored: (prompt ids [P*G], completions [P*G], per-function rewards [P*G, F], combined rewards with the
        overlong penalty [P*G]); adds the seconds spent to `times` and the verifier failures to `failures`."""
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
            times["tools"] += out.seconds_tools
            pending.append(submit_completions(self.rewards, rows, out.completions, state, out.columns))
            prompt_ids += out.prompt_ids
            flat += out.completions
        times["generate"] += generating
        if not pending:  # this rank has its groups; the others resample
            return [], [], torch.zeros(0, len(self.rewards.names)), torch.zeros(0)
        scored = [p.result() for p in pending]
        for s in scored:
            times["score"] += s.seconds_critical
            times["score_pool"] += s.seconds_pool
            failures.update(s.failures)
        self._observe_round(sum(self.rewards.pool_seconds(s) for s in scored), generating)
        per_func = torch.cat([s.per_func for s in scored])
        return prompt_ids, flat, per_func, self._combined(per_func, flat)

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

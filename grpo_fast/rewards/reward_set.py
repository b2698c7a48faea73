"""The run's reward functions: resolved from their specs, scored per completion (in worker processes by
default), combined with their weights.

Each function is called as TRL calls it: `fn(prompts=..., completions=..., completion_ids=...,
trainer_state=..., **dataset_columns)`, taking what it names (everything with **kwargs), and in the trainer's
process also TRL's `log_metric(name, value)` (the step's mean lands in the metrics as `reward_log/<name>`) and
`log_extra(column, values)` (one value per completion of the call, kept beside the audited completions); completions are
chat messages `[{"role": "assistant", "content": text}]` when the prompt is a list of messages, else
text. A function with a required `max_completion_length` parameter gets the rollout's (so DAPO's
`overlong_penalty` needs only its buffer).

Where a function runs: in the run's `RewardPool` (worker processes with a per-completion timeout; a
verifier that hangs, crashes or raises costs that completion's reward, counted in the step's
`reward/<name>/failures`), or in the trainer's process (no timeout or process isolation, no inter-process
traffic; a function that raises there costs the completion it raised on its failure reward, counted the same way:
nothing a completion holds can stop the step, only an InfrastructureError does). A spec's
`in_process: true` or `false` fixes the place; without it a function is scored in the pool until the workers
have measured it on one batch, and moves in-process when it is cheap there (`is_cheap`: each call costs less
than a few round trips to a worker), which is logged once. A function that cannot be pickled for a worker (a
lambda or closure) is scored in-process, with a warning; one defined in `__main__` (the training script or
notebook, TRL's usual pattern: the workers never run the script, so they cannot import it) is scored
in-process as TRL scores it, with one notice.

A spec's `when: {column: value or [values]}` routes its function to the rows whose columns match
(grpo_fast.rewards.routing): the other rows get None from it, and `full_rewards` leaves it out of their bar.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import pickle
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from grpo_fast.rewards.checks import release_verifiers
from grpo_fast.rewards.columns import TrainerState, call_reward, required_columns, reward_name, select_columns
from grpo_fast.rewards.outcomes import InfrastructureError, ProgramFailure
from grpo_fast.rewards.pool import RewardPool, Scores, lowest_reward
from grpo_fast.rewards.registry import reward_from_spec
from grpo_fast.rewards.routing import RoutedReward, unrouted

logger = logging.getLogger(__name__)


CHEAP_CALL_S = 5e-4
"""A function whose calls take at most this long on average in the workers is cheap: the pool's own round trip
costs ~0.1 ms per completion (measured: 128 completions of exact_match, 10 ms through 2 workers against 0.14 ms
in-process)."""
CHEAP_SLOWEST_S = 0.05
"""... and whose slowest call took at most this long (a function with slow cases, or one waiting on a server, keeps
the pool's timeout and its overlap with generation; 50 ms leaves room for a cheap call pre-empted on a busy machine)."""


def is_cheap(call_seconds: float, slowest_call: float, calls: int) -> bool:
    """Whether a function measured in the pool (its calls' total and slowest seconds over `calls` calls) is cheap
    enough to score in-process."""
    return calls > 0 and call_seconds / calls <= CHEAP_CALL_S and slowest_call <= CHEAP_SLOWEST_S


FAILURE_KINDS = ("failures", "program_failures", "infra_failures")
"""What `ScoredBatch.failures` counts per function: verifier failures (hang, crash, error), completions scored as
a program's failure (a ProgramFailure reward: the lowest reward, never a skip), and completions left unscored by
an infrastructure failure (None)."""


@dataclass
class RewardLog:
    """What the in-process functions log while one batch is scored, through TRL's `log_metric(name, value)` and
    `log_extra(column, values)` (values: one per completion of the call)."""

    metrics: dict[str, list[float]] = field(default_factory=dict)
    columns: dict[str, list] = field(default_factory=dict)

    def log_metric(self, name: str, value: float) -> None:
        self.metrics.setdefault(str(name), []).append(float(value))

    def log_extra(self, column: str, values) -> None:
        self.columns.setdefault(str(column), []).extend(values)

    def mark(self) -> tuple[dict[str, int], dict[str, int]]:
        return {k: len(v) for k, v in self.metrics.items()}, {k: len(v) for k, v in self.columns.items()}

    def rewind(self, mark: tuple[dict[str, int], dict[str, int]]) -> None:
        """Forget what was logged since `mark` (a call that raised is called again, one completion at a time)."""
        for logged, lengths in zip((self.metrics, self.columns), mark, strict=True):
            for key in list(logged):
                if key in lengths:
                    del logged[key][lengths[key] :]
                else:
                    del logged[key]


@dataclass(frozen=True)
class ScoredBatch:
    """per_func [N, F] rewards (NaN where a function returned None); failures: "<name>/<kind>" -> count, kind
    one of FAILURE_KINDS; seconds_critical: in-process scoring plus the wait for the pool after generation (what
    scoring adds to the step); seconds_pool: the pool's own wall time on this batch (overlapped or not, worker
    start-up included); call_seconds [F]: the seconds each function's calls took (in-process, or summed over the
    pool's workers); logged_metrics: log_metric's values by name; extra: log_extra's columns, [N] each (None where
    a batch logged none)."""

    per_func: torch.Tensor
    failures: dict[str, int]
    seconds_critical: float
    seconds_pool: float
    call_seconds: list[float]
    logged_metrics: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, list] = field(default_factory=dict)

    @staticmethod
    def concat(batches: list[ScoredBatch]) -> ScoredBatch:
        """The batches' completions in order, as one batch: rewards stacked, failures, seconds and logged metrics
        added up, extra columns joined."""
        metrics: dict[str, list[float]] = {}
        for b in batches:
            for name, values in b.logged_metrics.items():
                metrics.setdefault(name, []).extend(values)
        columns = sorted({c for b in batches for c in b.extra})
        return ScoredBatch(
            torch.cat([b.per_func for b in batches]),
            dict(sum((Counter(b.failures) for b in batches), Counter())),
            sum(b.seconds_critical for b in batches),
            sum(b.seconds_pool for b in batches),
            [sum(column) for column in zip(*(b.call_seconds for b in batches), strict=True)],
            metrics,
            {c: [v for b in batches for v in b.extra.get(c, [None] * len(b.per_func))] for c in columns},
        )


class PendingScores:
    """Scores being computed: the in-process functions' results now, the pooled ones (functions `pooled`) from a
    Future; `on_scores(pooled, scores)` sees the pool's answer first."""

    def __init__(
        self,
        per_func: torch.Tensor,
        call_seconds: list[float],
        pooled: list[int],
        future: Future | None,
        names: list[str],
        counts: Counter,
        on_scores: Callable[[list[int], Scores], None] | None = None,
        log: RewardLog | None = None,
    ) -> None:
        self._per_func, self._call_seconds, self._names = per_func, call_seconds, names
        self._pooled, self._future, self._counts, self._on_scores = pooled, future, counts, on_scores
        self._log = log or RewardLog()
        n = len(per_func)
        for column, values in self._log.columns.items():
            if len(values) != n:
                raise ValueError(f"log_extra({column!r}, values): {len(values)} values for {n} completions (one each)")

    def result(self) -> ScoredBatch:
        start = time.perf_counter()
        counts = Counter(self._counts)
        seconds_pool = 0.0
        in_process = sum(self._call_seconds)
        if self._future is not None:
            scores: Scores = self._future.result()
            for k, (j, column) in enumerate(zip(self._pooled, scores.rewards, strict=True)):
                self._per_func[:, j] = torch.tensor([math.nan if v is None else float(v) for v in column])
                self._call_seconds[j] = scores.call_seconds[k]
            names = [self._names[j] for j in self._pooled]
            counts.update(f"{names[f.function]}/failures" for f in scores.failures)
            for kind, per_function in (
                ("program_failures", scores.program_failures()),
                ("infra_failures", scores.infra_failures()),
            ):
                counts.update({f"{name}/{kind}": n for name, n in zip(names, per_function, strict=True) if n})
            seconds_pool = scores.seconds
            if self._on_scores is not None:
                self._on_scores(self._pooled, scores)
        waited = time.perf_counter() - start
        logged = (self._log.metrics, self._log.columns)
        return ScoredBatch(self._per_func, dict(counts), in_process + waited, seconds_pool, self._call_seconds, *logged)


# What `submit` passes every function beside the rows' own columns and the rollouts' (`columns`, `environments`).
GIVEN_COLUMNS = ("completion_ids", "trainer_state", "log_metric", "log_extra")


class RewardSet:
    """Reward functions with one weight each (default 1) and a distinct metric name each (the function's
    name, suffixed when two share it); scores through a RewardPool of `workers` processes (0: all
    in-process) with `timeout` seconds per completion, `failure_reward` for a failed one.

    in_process[j]: whether function j is scored in this process now; placed[j]: whether that is settled (by its
    spec, by workers 0, by pickling, or by one measurement in the pool)."""

    def __init__(
        self,
        specs: Sequence,
        weights: Sequence[float] | None = None,
        *,
        workers: int = 2,
        timeout: float = 30.0,
        failure_reward: float | None = None,
        max_infra_failures: int = 10,
        max_completion_length: int | None = None,
        sandbox: Mapping | str | None = None,
    ) -> None:
        self.funcs, self.in_process, self.placed, local_why = [], [], [], []
        for spec in specs:
            place = spec.get("in_process") if isinstance(spec, Mapping) else None  # True, False or None: measured
            when = spec.get("when") if isinstance(spec, Mapping) else None
            if isinstance(spec, Mapping):
                spec = {k: v for k, v in spec.items() if k not in ("in_process", "when")}
            fn = _with_run_defaults(reward_from_spec(spec), max_completion_length, sandbox)
            if when is not None:
                fn = RoutedReward(fn, when)
            self.funcs.append(fn)
            local_why.append(None if place or not workers else _why_not_pooled(fn))
            self.in_process.append(bool(place) or workers == 0 or local_why[-1] is not None)
            self.placed.append(place is not None or self.in_process[-1])
        self.weights = list(weights) if weights is not None else [1.0] * len(self.funcs)
        if len(self.weights) != len(self.funcs):
            raise ValueError(f"reward.weights: {len(self.weights)} weights for {len(self.funcs)} reward functions")
        self.names: list[str] = []
        for fn in self.funcs:
            name = reward_name(fn)
            self.names.append(name if name not in self.names else f"{name}_{len(self.names)}")
        for name, why in zip(self.names, local_why, strict=True):
            if why is not None:
                logger.warning(
                    "reward %s %s: scored in the trainer's process, without the reward pool's timeout", name, why
                )
        self._pool_options = dict(
            workers=workers, timeout=timeout, failure_reward=failure_reward, max_infra_failures=max_infra_failures
        )
        self._pool: RewardPool | None = None

    @classmethod
    def from_config(cls, config, funcs: Sequence | None = None, weights: Sequence[float] | None = None) -> RewardSet:
        """The reward set a TrainConfig's `reward` section describes (funcs, weights: to use instead of reward.funcs
        and reward.weights), with the rollout's max_completion_length for functions that require one."""
        r = config.reward
        return cls(
            r.funcs if funcs is None else funcs,
            r.weights if weights is None else weights,
            workers=r.workers,
            timeout=r.timeout,
            failure_reward=r.failure_reward,
            max_infra_failures=r.max_infra_failures,
            max_completion_length=config.rollout.max_completion_length,
            sandbox=r.sandbox,
        )

    def check_columns(self, columns: Iterable[str], source: str, environments: bool = False) -> None:
        """ValueError naming the function, the columns it needs and `source` (where the rows come from) when rows
        with `columns` (besides what `submit` passes itself, and with `environments` the rollouts' `environments` and
        `environment_reward`) lack one a function needs: before the run starts, where it was a KeyError from inside
        the first scoring."""
        columns = list(columns)
        have = set(columns) | set(GIVEN_COLUMNS) | ({"environments", "environment_reward"} if environments else set())
        for name, fn in zip(self.names, self.funcs, strict=True):
            if missing := [c for c in required_columns(fn) if c not in have]:
                raise ValueError(
                    f"reward.funcs: {name} needs the column(s) {missing}, which the rows of {source} do not have "
                    f"(their columns: {sorted(columns)}); add them to the dataset, or choose a reward that scores "
                    "what it has"
                )

    def full_rewards(self, rows: list[dict]) -> torch.Tensor:
        """[N] the combined reward of a completion of rows[i] that every function applying to that row scores 1
        (the sum of their weights; a function routed away from the row by its `when` does not count): the
        bar a completion must reach to count as solved."""
        applies = [[not isinstance(fn, RoutedReward) or fn.matches(row) for fn in self.funcs] for row in rows]
        weights = torch.tensor(self.weights, dtype=torch.float32)
        return torch.tensor(applies, dtype=torch.float32).reshape(len(rows), len(self.funcs)) @ weights

    def submit(
        self,
        rows: list[dict],
        texts: list[str],
        completion_ids: list[list[int]],
        state: TrainerState,
        *,
        conversations: list[list[dict] | None] | None = None,
        columns: Mapping[str, list] | None = None,
        environments: list | None = None,
    ) -> PendingScores:
        """Start scoring completion i (text, token ids) of dataset row rows[i]: in-process functions run now,
        pooled ones in the background; `.result()` waits for them. Multi-turn completions: `conversations[i]`, the
        assistant and tool messages, is what a function sees as the completion of a chat prompt; `columns`: extra
        per-completion columns (a rollout function's fields, `environment_reward`); `environments`: the rollouts'
        environment instances, for the in-process functions that take them (TRL's `environments`)."""
        prompts = [r["prompt"] for r in rows]
        conversations = conversations or [None] * len(rows)
        completions = [
            (c if c is not None else [{"role": "assistant", "content": t}]) if isinstance(p, list) else t
            for p, t, c in zip(prompts, texts, conversations, strict=True)
        ]
        table = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"} if rows else {}
        table.update(columns or {})
        table["completion_ids"] = completion_ids
        call_kwargs = {"trainer_state": state}
        log = RewardLog()
        local_kwargs = {**call_kwargs, "log_metric": log.log_metric, "log_extra": log.log_extra}
        if environments is not None:
            local_kwargs["environments"] = environments
        per_func = torch.full((len(rows), len(self.funcs)), math.nan)
        call_seconds = [0.0] * len(self.funcs)
        counts: Counter = Counter()
        for j in range(len(self.funcs)):
            if self.in_process[j]:
                start = time.perf_counter()
                values, failed = self._score_here(j, prompts, completions, table, local_kwargs, log)
                per_func[:, j] = torch.tensor([math.nan if v is None else float(v) for v in values])
                counts[f"{self.names[j]}/failures"] += failed
                counts[f"{self.names[j]}/program_failures"] += sum(isinstance(v, ProgramFailure) for v in values)
                call_seconds[j] = time.perf_counter() - start
        pooled = [j for j, local in enumerate(self.in_process) if not local]
        future = None
        if pooled and rows:
            funcs = [self.funcs[j] for j in pooled]
            future = self._get_pool().submit(funcs, prompts, completions, table, call_kwargs)
        return PendingScores(per_func, call_seconds, pooled, future, self.names, +counts, self._place, log)

    def _score_here(
        self, j: int, prompts: list, completions: list, table: dict[str, list], kwargs: dict, log: RewardLog
    ) -> tuple[list[float | None], int]:
        """(rewards, how many completions failed) of function j in this process, failures as the pool treats them:
        an exception a completion may have caused (anything but InfrastructureError, which stays loud) costs that
        completion alone its failure reward, a ProgramFailure. The batch is one call; when it raises, each
        completion is called alone to find which did it (what the batch call logged is forgotten). One that raises
        on every completion of a batch of several is the function's bug, not theirs: RuntimeError naming it. A
        missing column raises, as in the pool."""
        fn = self.funcs[j]
        select_columns(fn, {**kwargs, **table})
        mark = log.mark()
        try:
            return call_reward(fn, prompts, completions, table, kwargs), 0
        except InfrastructureError:
            raise
        except Exception:  # noqa: BLE001 - whose fault it was is found one completion at a time
            log.rewind(mark)
        values: list[float | None] = []
        failed = 0
        for i in range(len(completions)):
            one = {k: v[i : i + 1] for k, v in table.items()}
            one_kwargs = {k: v[i : i + 1] if k == "environments" else v for k, v in kwargs.items()}
            try:
                values += call_reward(fn, prompts[i : i + 1], completions[i : i + 1], one, one_kwargs)
            except InfrastructureError:
                raise
            except Exception as exc:  # noqa: BLE001 - the completion's doing: scored as a failure, never raised
                message = f"{type(exc).__name__}: {exc}"[-300:]
                values.append(ProgramFailure(self._failure_reward(fn), f"error: {message}"))
                failed += 1
                logger.warning("reward %s failed on completion %d (error): %s", self.names[j], i, message)
        if failed == len(completions) > 1:
            raise RuntimeError(
                f"reward {self.names[j]} raised on each of the batch's {failed} completions ({values[0].reason}): a "
                "bug in the function; it should score a completion it cannot parse low (or None), not raise"
            )
        return values, failed

    def _failure_reward(self, fn) -> float:
        """The reward of a completion `fn` failed on: reward.failure_reward, else the function's lowest reward (as the
        pool scores it)."""
        configured = self._pool_options["failure_reward"]
        return lowest_reward(fn) if configured is None else configured

    def pool_seconds(self, scored: ScoredBatch) -> float:
        """The seconds the pool's workers would need for `scored`'s batch with the functions pooled now: their
        calls' seconds shared among the workers (worker start-up and functions moved in-process left out)."""
        pooled = [s for s, local in zip(scored.call_seconds, self.in_process, strict=True) if not local]
        return sum(pooled) / max(self._pool_options["workers"], 1)

    def _place(self, pooled: list[int], scores: Scores) -> None:
        """Settles where each function of `pooled` not yet placed runs, from what its calls cost in the workers:
        in-process when `is_cheap` and none of its calls failed (a verifier that hung, crashed or raised keeps the
        pool's isolation), else in the pool (see the module doc)."""
        calls = len(scores.rewards[0]) if scores.rewards else 0
        failed = {f.function for f in scores.failures}
        for k, j in enumerate(pooled):
            if self.placed[j]:
                continue
            self.placed[j] = True
            mean = scores.call_seconds[k] / max(calls, 1)
            if k not in failed and is_cheap(scores.call_seconds[k], scores.slowest_call[k], calls):
                self.in_process[j] = True
                logger.info(
                    "reward %s: %.3f ms per completion in the reward workers (slowest %.3f ms): scored in-process from "
                    "now on (its spec's in_process: false keeps it in the pool)",
                    self.names[j],
                    mean * 1e3,
                    scores.slowest_call[k] * 1e3,
                )

    def combine(self, per_func: torch.Tensor) -> torch.Tensor:
        """[N, F] -> [N] weighted sum (see combine_rewards)."""
        return combine_rewards(per_func, self.weights)

    def _get_pool(self) -> RewardPool:
        if self._pool is None:
            self._pool = RewardPool(**self._pool_options)
        return self._pool

    def close(self) -> None:
        """Stop the worker processes (a later `submit` starts new ones) and what the functions keep alive in
        this process (grpo_fast.rewards.checks.release_verifiers)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        release_verifiers(self.funcs)


def _why_not_pooled(fn) -> str | None:
    """Why `fn` cannot be sent to a reward-pool worker, or None: a function of `__main__` (a worker never runs
    the training script, so it cannot import it), one that does not pickle (a lambda, a closure), or one that takes
    `environments` (the rollouts' live environment instances, which stay in this process)."""
    inner = getattr(unrouted(fn), "func", unrouted(fn))
    params = inspect.signature(fn).parameters
    if "environments" in params:
        return "takes `environments` (the rollouts' environment instances stay in the trainer's process)"
    if "log_metric" in params or "log_extra" in params:
        return "takes `log_metric` or `log_extra` (they log in the trainer's process)"
    module = getattr(inner, "__module__", None) if inspect.isroutine(inner) else type(inner).__module__
    if module == "__main__":
        return (
            "is defined in __main__ (the training script or notebook; the pool's workers never run it, so they "
            "cannot import it)"
        )
    try:
        pickle.dumps(fn)
    except Exception:  # noqa: BLE001 - any failure to pickle means "cannot go to a worker"
        return "cannot be pickled for a worker process"
    return None


def _with_run_defaults(fn, max_completion_length: int | None, sandbox: Mapping | str | None):
    """`fn` with the run's max_completion_length bound when it requires one, and the run's sandbox when it takes
    one; neither where the spec gave its own."""
    params = inspect.signature(fn).parameters
    bound = {}
    length = params.get("max_completion_length")
    if max_completion_length is not None and length is not None and length.default is length.empty:
        bound["max_completion_length"] = max_completion_length
    if sandbox is not None and "sandbox" in params and "sandbox" not in (getattr(fn, "keywords", None) or {}):
        bound["sandbox"] = sandbox
    return functools.partial(fn, **bound) if bound else fn


def combine_rewards(per_func: torch.Tensor, weights: list[float] | None = None) -> torch.Tensor:
    """per_func [N, F] with NaN where a function returned None -> weighted sum [N] (NaN-as-0, TRL's nansum).
    A row where every function returned None is unscorable and stays NaN (TRL): `group_advantages` leaves it
    out of its group's baseline and gives it advantage 0."""
    w = torch.ones(per_func.shape[1]) if weights is None else torch.tensor(weights, dtype=torch.float32)
    out = torch.nansum(per_func * w, dim=1)
    if per_func.shape[1]:
        out[torch.isnan(per_func).all(dim=1)] = math.nan
    return out

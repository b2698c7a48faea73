"""Reward execution in a process pool, with a per-completion timeout.

Failure never pays (grpo_fast.rewards.outcomes). A verifier that hangs, raises, or kills its process
(segfault, os.abort, OOM) may have been driven there by the completion it was scoring: that completion
gets `failure_reward` (default None: the function's lowest reward, from its RewardInfo, else 0.0) as a
`ProgramFailure`, never a skip; the failure is logged and recorded in `Scores.failures` with cause
"program", the worker is killed and replaced if needed, and the batch goes on. A verifier that raises
`InfrastructureError` (it cannot score, whatever the completion) gives that completion None and a
failure with cause "infrastructure"; more than `max_infra_failures` of those in the pool's life raise
InfrastructureError: a run must not go on skipping completions silently. `Scores.failures` lists what
went wrong with verifiers; the completions scored as a program's failure, by the pool or by their
verifier itself (code_tests returns a ProgramFailure for a program that crashed or hung), are the
rewards that are ProgramFailures (`Scores.program_failures`). A worker killed from outside while
idle or starting up (the OOM killer) costs nothing: it is replaced; only workers that die at
start-up _STARTUP_ATTEMPTS times in a row (their imports fail) stop the scoring.

Inside a worker, `time_left()` says how many seconds the item being scored has before the pool
kills it (less a margin), so that a verifier can stop in time and score what it has (code_tests
does).

Work unit: one (reward function, completion) pair, called as `fn([prompt], [completion], **columns)`
with the row's column values, so a timeout measures one completion. Workers receive items in chunks
and answer item by item; the timeout clock of an item starts when the previous answer arrived. A
worker's start-up (imports) does not count: items go only to workers that said they are ready; nor does
loading a batch's functions (unpickling imports their modules): the clock starts when the worker says
it has loaded them.
Reward functions (and functools.partial of them) must be picklable: workers are started with
"spawn" by default, which never forks a parent holding CUDA or threads.

`score` blocks; `submit` queues the same work on one background thread of the pool and returns a
`concurrent.futures.Future`, so a caller can generate more completions while these are scored.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import pickle
import time
import traceback
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from grpo_fast.rewards.columns import RewardFunc, call_reward, reward_name, select_columns
from grpo_fast.rewards.outcomes import InfrastructureError, ProgramFailure
from grpo_fast.rewards.self_test import info_of

log = logging.getLogger(__name__)

_CHUNK = 16
_STARTUP_S = 300.0  # a fresh worker imports the reward modules (seconds on a loaded machine)
_STARTUP_ATTEMPTS = 3  # workers in a row that may die before they are ready, before the pool gives up
_MARGIN = 0.1  # share of the timeout `time_left` keeps back for the verifier to answer (at least 1 s)
_item_deadline: float | None = None  # in a worker: when the pool gives up on the current item


def time_left() -> float | None:
    """In a pool worker: seconds the current item may still take (None outside a pool)."""
    return None if _item_deadline is None else _item_deadline - time.monotonic()


@dataclass(frozen=True)
class Failure:
    """One verifier failure: which function (its name, and its position in the call's list), which
    completion, "timeout" | "crash" | "error" | "infrastructure", details, and its cause: "program"
    (the completion may have caused it: it scored as a wrong answer) or "infrastructure" (it scored
    None)."""

    reward: str
    index: int
    kind: str
    message: str
    function: int = 0
    cause: str = "program"


@dataclass
class Scores:
    """Rewards `[num_funcs][num_completions]` (float or None), the failures met on the way, the wall seconds the
    scoring took, and per function the seconds its calls took inside the workers (`call_seconds`: their sum;
    `slowest_call`: the longest one; a timed-out call counts its timeout)."""

    rewards: list[list[float | None]]
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    call_seconds: list[float] = field(default_factory=list)
    slowest_call: list[float] = field(default_factory=list)

    def add_call(self, function: int, seconds: float) -> None:
        self.call_seconds[function] += seconds
        self.slowest_call[function] = max(self.slowest_call[function], seconds)

    def program_failures(self) -> list[int]:
        """Per function: completions scored as a program's failure (their reward is a ProgramFailure)."""
        return [sum(isinstance(r, ProgramFailure) for r in rewards) for rewards in self.rewards]

    def infra_failures(self) -> list[int]:
        """Per function: completions not scored for an infrastructure failure (their reward is None)."""
        counts = [0] * len(self.rewards)
        for failure in self.failures:
            counts[failure.function] += failure.cause == "infrastructure"
        return counts


def _worker_main(conn: Connection) -> None:
    global _item_deadline
    funcs: list[RewardFunc] = []
    batch = -1
    conn.send("ready")
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        batch_id, blob, items, timeout = message
        if batch_id != batch:
            (funcs, call_kwargs), batch = pickle.loads(blob), batch_id
            conn.send("loaded")
        for task, f, prompt, completion, row in items:
            _item_deadline = time.monotonic() + timeout - max(1.0, _MARGIN * timeout)
            start = time.perf_counter()
            try:
                columns = {k: [v] for k, v in row.items()}
                value = call_reward(funcs[f], [prompt], [completion], columns, call_kwargs)[0]
                conn.send((task, "ok", value, time.perf_counter() - start))
            except InfrastructureError as exc:
                conn.send((task, "infrastructure", f"{type(exc).__name__}: {exc}", time.perf_counter() - start))
            except Exception:
                conn.send((task, "error", traceback.format_exc(limit=5), time.perf_counter() - start))
            finally:
                _item_deadline = None


class _Worker:
    def __init__(self, ctx: mp.context.BaseContext) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.batch = -1
        self.pending: deque[int] = deque()
        self.ready = False
        self.deadline = time.monotonic() + _STARTUP_S

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


@dataclass
class _Job:
    """One `score` call in flight: its queue of items (task, f, prompt, completion, row) where task = f * n + i
    for reward function f and completion i, and the Scores its results land in."""

    n: int
    names: list[str]
    lowest: list[float]  # what a failed call of function f pays
    blob: bytes  # the pickled (functions, call_kwargs), sent once per worker per batch
    items: deque
    by_task: dict[int, tuple]
    scores: Scores  # with call_seconds and slowest_call per function

    @classmethod
    def of(
        cls,
        reward_funcs: Sequence[RewardFunc],
        prompts: Sequence[Any],
        completions: Sequence[Any],
        columns: dict[str, Sequence[Any]],
        call_kwargs: dict[str, Any],
        pool: RewardPool,
    ) -> _Job:
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"prompts: {len(prompts)} prompts for {n} completions")
        for name, values in columns.items():
            if len(values) != n:
                raise ValueError(f"column {name!r}: {len(values)} values for {n} completions")
        per_func = [select_columns(fn, {**call_kwargs, **columns}) for fn in reward_funcs]
        per_func = [{k: v for k, v in chosen.items() if k in columns} for chosen in per_func]
        items = deque(
            (f * n + i, f, prompts[i], completions[i], {k: v[i] for k, v in per_func[f].items()})
            for f in range(len(reward_funcs))
            for i in range(n)
        )
        return cls(
            n=n,
            names=[reward_name(fn) for fn in reward_funcs],
            lowest=[lowest_reward(fn) if pool.failure_reward is None else pool.failure_reward for fn in reward_funcs],
            blob=pickle.dumps((list(reward_funcs), call_kwargs)),
            items=items,
            by_task={item[0]: item for item in items},
            scores=Scores(
                [[None] * n for _ in reward_funcs],
                call_seconds=[0.0] * len(reward_funcs),
                slowest_call=[0.0] * len(reward_funcs),
            ),
        )

    def done(self, task: int, value: float | None) -> None:
        self.scores.rewards[task // self.n][task % self.n] = value

    def fail(self, task: int, kind: str, message: str) -> None:
        """The verifier hung, crashed or raised on this completion: it pays the function's lowest reward."""
        f, i = divmod(task, self.n)
        self.scores.rewards[f][i] = ProgramFailure(self.lowest[f], f"{kind}: {message.strip()[-300:]}")
        self.scores.failures.append(Failure(self.names[f], i, kind, message, f))
        log.warning("reward %s failed on completion %d (%s): %s", self.names[f], i, kind, message.strip()[-500:])

    def record_infrastructure(self, task: int, message: str) -> str:
        """The verifier could not score this completion (reward stays None); returns the function's name."""
        f, i = divmod(task, self.n)
        self.scores.failures.append(Failure(self.names[f], i, "infrastructure", message, f, "infrastructure"))
        log.error("reward %s could not score completion %d (infrastructure): %s", self.names[f], i, message[-500:])
        return self.names[f]


class RewardPool:
    """A pool of verifier processes; reuse one across training steps (start-up costs ~1 s per worker).

    workers: processes (default: 2). timeout: seconds one completion may take in one reward function.
    failure_reward: reward of a completion whose verifier hung, crashed or raised (None = the function's
    lowest reward, see module doc). max_infra_failures: infrastructure failures (None rewards) the pool
    tolerates in its life before it raises InfrastructureError. mp_context: multiprocessing start
    method ("spawn", "forkserver", "fork").
    """

    def __init__(
        self,
        workers: int = 2,
        timeout: float = 30.0,
        failure_reward: float | None = None,
        mp_context: str = "spawn",
        max_infra_failures: int = 10,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers: must be >= 1, got {workers}")
        if timeout <= 0:
            raise ValueError(f"timeout: must be > 0, got {timeout}")
        if max_infra_failures < 0:
            raise ValueError(f"max_infra_failures: must be >= 0, got {max_infra_failures}")
        self.timeout = timeout
        self.failure_reward = failure_reward
        self.max_infra_failures = max_infra_failures
        self.infra_failures = 0
        self._ctx = mp.get_context(mp_context)
        self._workers = [_Worker(self._ctx) for _ in range(workers)]
        self._batch = 0
        self._startup_deaths = 0  # workers in a row that died before they were ready
        self._background: ThreadPoolExecutor | None = None

    def submit(self, *args: Any, **kwargs: Any) -> Future[Scores]:
        """`score(*args, **kwargs)` on the pool's background thread (jobs run one after another); its Future."""
        if self._background is None:
            self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-pool")
        return self._background.submit(self.score, *args, **kwargs)

    def score(
        self,
        reward_funcs: Sequence[RewardFunc],
        prompts: Sequence[Any],
        completions: Sequence[Any],
        columns: Mapping[str, Sequence[Any]] | None = None,
        call_kwargs: Mapping[str, Any] | None = None,
    ) -> Scores:
        """Every reward function on every completion. columns: one value per completion; call_kwargs:
        passed as they are to every call of a function that takes them (e.g. TRL's `trainer_state`).
        Columns are checked first: a function needing a column that is absent raises KeyError naming it,
        before any work starts."""
        start = time.perf_counter()
        self._batch += 1
        job = _Job.of(reward_funcs, prompts, completions, dict(columns or {}), dict(call_kwargs or {}), self)
        while job.items or any(w.pending for w in self._workers):
            self._hand_out(job)
            busy = [w for w in self._workers if w.pending or not w.ready]
            left = min(w.deadline for w in busy) - time.monotonic()
            ready = wait([w.conn for w in busy], timeout=max(0.0, left))
            for w in busy:
                if w.conn in ready:
                    self._receive(w, job)
                elif time.monotonic() >= w.deadline:
                    if not w.ready:
                        raise RuntimeError(f"reward worker not ready after {_STARTUP_S} s")
                    task = w.pending.popleft()
                    job.scores.add_call(task // job.n, self.timeout)
                    job.fail(task, "timeout", f"no result within {self.timeout} s")
                    self._replace(w, job)
        job.scores.seconds = time.perf_counter() - start
        return job.scores

    def _hand_out(self, job: _Job) -> None:
        """A chunk of the queue to every ready, idle worker (with the batch's functions, the first time)."""
        for w in self._workers:
            if w.ready and job.items and not w.pending:
                chunk = [job.items.popleft() for _ in range(min(_CHUNK, len(job.items)))]
                loading = w.batch != self._batch
                try:
                    w.conn.send((self._batch, job.blob if loading else None, chunk, self.timeout))
                except OSError:  # it died while idle (killed from outside): no item of it was lost
                    job.items.extendleft(reversed(chunk))
                    self._replace(w, job)
                    continue
                w.batch = self._batch
                w.pending.extend(item[0] for item in chunk)
                w.deadline = time.monotonic() + (_STARTUP_S if loading else self.timeout)

    def _receive(self, w: _Worker, job: _Job) -> None:
        """Read one message of `w`: it is ready, it loaded the batch, an item's result, or it died."""
        try:
            message = w.conn.recv()
        except (EOFError, OSError):
            w.proc.join(1.0)
            if not w.ready:  # killed from outside (OOM) once: replaced; every time: broken
                self._startup_deaths += 1
                if self._startup_deaths >= _STARTUP_ATTEMPTS:
                    raise RuntimeError(
                        f"reward worker died at start-up {self._startup_deaths} times in a row (last exit "
                        f"code {w.proc.exitcode}): the reward modules do not import in a fresh process"
                    ) from None
            else:
                job.fail(w.pending.popleft(), "crash", f"worker died (exit code {w.proc.exitcode})")
            self._replace(w, job)
            return
        if message == "ready":
            w.ready = True
            self._startup_deaths = 0
            return
        w.deadline = time.monotonic() + self.timeout
        if message == "loaded":
            return
        task, status, value, seconds = message
        w.pending.popleft()
        job.scores.add_call(task // job.n, seconds)
        if status == "ok":
            job.done(task, value)
        elif status == "infrastructure":
            self._infrastructure(job, task, value)
        else:
            job.fail(task, "error", value)

    def _infrastructure(self, job: _Job, task: int, message: str) -> None:
        """A verifier that could not score (None reward); more than max_infra_failures in the pool's life raise."""
        name = job.record_infrastructure(task, message)
        self.infra_failures += 1
        if self.infra_failures > self.max_infra_failures:
            raise InfrastructureError(
                f"reward {name}: {self.infra_failures} infrastructure failures (more than max_infra_failures="
                f"{self.max_infra_failures}); the last: {message[-1000:]}"
            )

    def _replace(self, worker: _Worker, job: _Job) -> None:
        """Kill `worker`, put its unfinished items back in front of the queue, start a fresh worker."""
        worker.kill()
        job.items.extendleft(job.by_task[t] for t in reversed(worker.pending))
        self._workers[self._workers.index(worker)] = _Worker(self._ctx)

    def close(self) -> None:
        """Finish the submitted jobs, then stop the workers (idempotent)."""
        if self._background is not None:
            self._background.shutdown(wait=True)
            self._background = None
        for w in self._workers:
            if w.proc.is_alive():
                try:
                    w.conn.send(None)
                except OSError:
                    pass
                w.proc.join(1.0)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join()
        self._workers = []

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lowest_reward(fn: RewardFunc) -> float:
    """The lowest reward `fn` gives (its RewardInfo's range, with its bound options), or 0.0 where that
    is unknown or unbounded."""

    info, options = info_of(fn)
    if info is None:
        return 0.0
    low = info.reward_range(options)[0]
    return float(low) if math.isfinite(low) else 0.0


def score_completions(
    reward_funcs: Sequence[RewardFunc],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: Mapping[str, Sequence[Any]] | None = None,
    *,
    timeout: float = 30.0,
    workers: int = 2,
    failure_reward: float | None = None,
    max_infra_failures: int = 10,
) -> Scores:
    """One-off scoring with a temporary `RewardPool` (a trainer should keep one pool instead)."""
    options = dict(
        workers=workers, timeout=timeout, failure_reward=failure_reward, max_infra_failures=max_infra_failures
    )
    with RewardPool(**options) as pool:
        return pool.score(reward_funcs, prompts, completions, columns)

"""Reward execution in a process pool, with a per-completion timeout.

A verifier that hangs, raises, or kills its process (segfault, os.abort, OOM) costs the reward of
the one completion it was scoring: the pool logs the failure, records it in `Scores.failures`, gives
that completion `failure_reward` (default None: skipped by the trainer, neither rewarded nor punished),
kills and replaces the worker if needed, and carries on with the rest of the batch. A worker killed
from outside while idle or starting up (the OOM killer) costs nothing: it is replaced; only workers that
die at start-up _STARTUP_ATTEMPTS times in a row (their imports fail) stop the scoring.

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

log = logging.getLogger(__name__)

_CHUNK = 16
_STARTUP_S = 300.0  # a fresh worker imports the reward modules (seconds on a loaded machine)
_STARTUP_ATTEMPTS = 3  # workers in a row that may die before they are ready, before the pool gives up


@dataclass(frozen=True)
class Failure:
    """One verifier failure: which function (its name, and its position in the call's list), which
    completion, "timeout" | "crash" | "error", details."""

    reward: str
    index: int
    kind: str
    message: str
    function: int = 0


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


def _worker_main(conn: Connection) -> None:
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
        batch_id, blob, items = message
        if batch_id != batch:
            (funcs, call_kwargs), batch = pickle.loads(blob), batch_id
            conn.send("loaded")
        for task, f, prompt, completion, row in items:
            start = time.perf_counter()
            try:
                columns = {k: [v] for k, v in row.items()}
                value = call_reward(funcs[f], [prompt], [completion], columns, call_kwargs)[0]
                conn.send((task, "ok", value, time.perf_counter() - start))
            except Exception:
                conn.send((task, "error", traceback.format_exc(limit=5), time.perf_counter() - start))


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


class _Job:
    """One `score` call's work: n completions, the items still to send ((task, function, prompt, completion,
    columns); task = function * n + completion), every item by task, the function names, the scores so far."""

    def __init__(self, n: int, items: deque, names: list[str], failure_reward: float | None) -> None:
        self.n, self.items, self.names, self.failure_reward = n, items, names, failure_reward
        self.by_task = {item[0]: item for item in items}
        zeros = [0.0] * len(names)
        self.scores = Scores([[None] * n for _ in names], call_seconds=list(zeros), slowest_call=list(zeros))

    def fail(self, task: int, kind: str, message: str) -> None:
        f, i = divmod(task, self.n)
        self.scores.rewards[f][i] = self.failure_reward
        self.scores.failures.append(Failure(self.names[f], i, kind, message, f))
        log.warning("reward %s failed on completion %d (%s): %s", self.names[f], i, kind, message.strip()[-500:])


class RewardPool:
    """A pool of verifier processes; reuse one across training steps (start-up costs ~1 s per worker).

    workers: processes (default: 2). timeout: seconds one completion may take in one reward function.
    failure_reward: reward of a completion whose verifier failed (None = skipped, or e.g. 0.0).
    mp_context: multiprocessing start method ("spawn", "forkserver", "fork").
    """

    def __init__(
        self,
        workers: int = 2,
        timeout: float = 30.0,
        failure_reward: float | None = None,
        mp_context: str = "spawn",
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers: must be >= 1, got {workers}")
        if timeout <= 0:
            raise ValueError(f"timeout: must be > 0, got {timeout}")
        self.timeout = timeout
        self.failure_reward = failure_reward
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
        columns = dict(columns or {})
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"prompts: {len(prompts)} prompts for {n} completions")
        for name, values in columns.items():
            if len(values) != n:
                raise ValueError(f"column {name!r}: {len(values)} values for {n} completions")
        per_func = [select_columns(fn, {**(call_kwargs or {}), **columns}) for fn in reward_funcs]
        per_func = [{k: v for k, v in chosen.items() if k in columns} for chosen in per_func]
        self._batch += 1
        items = deque(
            (f * n + i, f, prompts[i], completions[i], {k: v[i] for k, v in per_func[f].items()})
            for f in range(len(reward_funcs))
            for i in range(n)
        )
        job = _Job(n, items, [reward_name(fn) for fn in reward_funcs], self.failure_reward)
        blob = pickle.dumps((list(reward_funcs), dict(call_kwargs or {})))
        while job.items or any(w.pending for w in self._workers):
            self._dispatch(job, blob)
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
                    job.scores.add_call(task // n, self.timeout)
                    job.fail(task, "timeout", f"no result within {self.timeout} s")
                    self._replace(w, job)
        job.scores.seconds = time.perf_counter() - start
        return job.scores

    def _dispatch(self, job: _Job, blob: bytes) -> None:
        """A chunk of the job's items to every ready idle worker (with the batch's functions, `blob`, the first
        time it sees this batch)."""
        for w in self._workers:
            if w.ready and job.items and not w.pending:
                chunk = [job.items.popleft() for _ in range(min(_CHUNK, len(job.items)))]
                loading = w.batch != self._batch
                try:
                    w.conn.send((self._batch, blob if loading else None, chunk))
                except OSError:  # it died while idle (killed from outside): no item of it was lost
                    job.items.extendleft(reversed(chunk))
                    self._replace(w, job)
                    continue
                w.batch = self._batch
                w.pending.extend(item[0] for item in chunk)
                w.deadline = time.monotonic() + (_STARTUP_S if loading else self.timeout)

    def _receive(self, w: _Worker, job: _Job) -> None:
        """One message of worker `w`: ready, loaded, or an item's result; a dead worker is replaced (its item
        failed as a crash, unless it died before it was ready)."""
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
            job.scores.rewards[task // job.n][task % job.n] = value
        else:
            job.fail(task, "error", value)

    def _replace(self, worker: _Worker, job: _Job) -> None:
        """Kill `worker`, put its unfinished items back in front of the job's queue, start a fresh worker."""
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


def score_completions(
    reward_funcs: Sequence[RewardFunc],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: Mapping[str, Sequence[Any]] | None = None,
    *,
    timeout: float = 30.0,
    workers: int = 2,
    failure_reward: float | None = None,
) -> Scores:
    """One-off scoring with a temporary `RewardPool` (a trainer should keep one pool instead)."""
    with RewardPool(workers=workers, timeout=timeout, failure_reward=failure_reward) as pool:
        return pool.score(reward_funcs, prompts, completions, columns)

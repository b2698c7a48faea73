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

Inside a worker, `time_left()` says how many seconds the call being made has before the pool kills
it (less a margin), so that a verifier can stop in time and score what it has (code_tests does), and
`in_worker()` is true.

Work unit: a call of one reward function, `fn(prompts, completions, **columns)` with the rows' column
values. A function scores one completion per call, so that a timeout measures one completion, unless
it was declared with a `batch_option` (`@reward(..., batch_option="batch_size")`, the learned reward
model): then one call scores up to that option's value of its completions (`batch_size_of`), with
`timeout` seconds per completion in it; a call of several that fails in any way (raises, hangs, kills
its worker) is made again one completion at a time, so that a failure is still one completion's.
Workers receive calls in chunks and answer call by call; the timeout clock of a call starts when the
previous answer arrived. A worker's start-up (imports) does not count: calls go only to workers that
said they are ready; nor does loading a batch's functions (unpickling imports their modules): the
clock starts when the worker says it has loaded them.

Workers are fresh interpreters (`python -c`, with the parent's sys.path) that import only this module
and the modules of the functions they are sent: unlike multiprocessing's "spawn", they never run the
parent's `__main__` again, so a training script without an `if __name__ == "__main__":` guard (a
notebook, an example) starts them safely. Reward functions (and functools.partial of them) must be
picklable by reference, from a module a worker can import: functions of `__main__` cannot be sent
(RewardSet scores them in the trainer's process).

`score` blocks; `submit` queues the same work on one background thread of the pool and returns a
`concurrent.futures.Future`, so a caller can generate more completions while these are scored.
"""

from __future__ import annotations

import atexit
import inspect
import json
import logging
import math
import pickle
import socket
import subprocess
import sys
import time
import traceback
import weakref
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

_CHUNK = 16  # completions per message to a worker (at least one call's)
_STARTUP_S = 300.0  # a fresh worker imports the reward modules (seconds on a loaded machine)
_STARTUP_ATTEMPTS = 3  # workers in a row that may die before they are ready, before the pool gives up
_MARGIN = 0.1  # share of the timeout `time_left` keeps back for the verifier to answer (at least 1 s)
_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from grpo_fast.rewards.pool import _worker_process; _worker_process(int(sys.argv[2]))"
)
_item_deadline: float | None = None  # in a worker: when the pool gives up on the current call
_in_worker = False


def time_left() -> float | None:
    """In a pool worker: seconds the current call may still take (None outside a pool)."""
    return None if _item_deadline is None else _item_deadline - time.monotonic()


def in_worker() -> bool:
    """Whether this process is a RewardPool worker."""
    return _in_worker


def batch_size_of(fn: RewardFunc) -> int:
    """How many completions one call of `fn` may score in the pool: the value of the option its RewardInfo
    names as `batch_option` (bound by its spec, else the function's default); 1 for every other function,
    and where that value is not a positive integer (the function's own check names it when called)."""
    info, options = info_of(fn)
    if info is None or info.batch_option is None:
        return 1
    if info.batch_option in options:
        value = options[info.batch_option]
    else:
        param = inspect.signature(getattr(fn, "func", fn)).parameters.get(info.batch_option)
        value = None if param is None else param.default
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


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
    `slowest_call`: the longest one; a timed-out call counts its time limit)."""

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


def _call_budget(timeout: float, completions: int) -> float:
    """Seconds a call of `completions` completions has before its worker is killed."""
    return timeout * completions


def _worker_process(fd: int) -> None:
    """A worker's main: serves the pool at the other end of the socket `fd` (see _start_worker)."""
    global _in_worker
    _in_worker = True
    conn = Connection(fd)
    try:
        _worker_main(conn)
    except (BrokenPipeError, ConnectionResetError):  # the pool is gone: nothing to answer to
        pass


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
        batch_id, blob, calls, timeout = message
        if batch_id != batch:
            (funcs, call_kwargs), batch = pickle.loads(blob), batch_id
            conn.send("loaded")
        for tasks, f, prompts, completions, columns in calls:
            budget = _call_budget(timeout, len(tasks))
            _item_deadline = time.monotonic() + budget - max(1.0, _MARGIN * budget)
            start = time.perf_counter()
            try:
                values = call_reward(funcs[f], prompts, completions, columns, call_kwargs)
                conn.send((tasks, "ok", values, time.perf_counter() - start))
            except InfrastructureError as exc:
                conn.send((tasks, "infrastructure", f"{type(exc).__name__}: {exc}", time.perf_counter() - start))
            except Exception:
                conn.send((tasks, "error", traceback.format_exc(limit=5), time.perf_counter() - start))
            finally:
                _item_deadline = None


class _WorkerProcess:
    """A worker interpreter (`python -c _BOOT`), with the parts of multiprocessing.Process's interface the pool
    uses: pid, kill, join, is_alive, exitcode."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            self._popen = subprocess.Popen(
                [sys.executable, "-c", _BOOT, json.dumps(sys.path), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.pid = self._popen.pid
        _LIVE.add(self)

    def kill(self) -> None:
        if self._popen.poll() is None:
            self._popen.kill()

    def join(self, timeout: float | None = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()


_LIVE: weakref.WeakSet[_WorkerProcess] = weakref.WeakSet()


@atexit.register
def _kill_leftover_workers() -> None:
    """Workers of pools never closed end with the process that started them (as daemonic processes do)."""
    for proc in list(_LIVE):
        proc.kill()


class _Worker:
    def __init__(self) -> None:
        self.proc = _WorkerProcess()
        self.conn = self.proc.conn
        self.batch = -1
        self.pending: deque[tuple[int, ...]] = deque()  # the tasks of each call sent and not answered
        self.ready = False
        self.deadline = time.monotonic() + _STARTUP_S

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()

    def pending_tasks(self) -> list[int]:
        return [task for call in self.pending for task in call]


class _Job:
    """One `score` call's work: the (task, function, prompt, completion, row) items left, their grouping into
    calls, and the results. Task t is function t // n on completion t % n."""

    def __init__(self, pool: RewardPool, reward_funcs, prompts, completions, per_func: list[dict], blob: bytes) -> None:
        self.pool, self.n, self.blob = pool, len(completions), blob  # blob: sent once per worker per batch
        self.items = deque(
            (f * self.n + i, f, prompts[i], completions[i], {k: v[i] for k, v in per_func[f].items()})
            for f in range(len(reward_funcs))
            for i in range(self.n)
        )
        self.by_task = {item[0]: item for item in self.items}
        self.alone: set[int] = set()  # tasks whose call of several failed: each is now called alone
        self.batch_sizes = [batch_size_of(fn) for fn in reward_funcs]
        self.names = [reward_name(fn) for fn in reward_funcs]
        failure_reward = pool.failure_reward
        self.lowest = [lowest_reward(fn) if failure_reward is None else failure_reward for fn in reward_funcs]
        self.scores = Scores(
            [[None] * self.n for _ in reward_funcs],
            call_seconds=[0.0] * len(reward_funcs),
            slowest_call=[0.0] * len(reward_funcs),
        )

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
        """The job of one `score` call, its arguments checked: one prompt and one value of each column per
        completion; a function needing a column that is absent raises KeyError naming it."""
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"prompts: {len(prompts)} prompts for {n} completions")
        for name, values in columns.items():
            if len(values) != n:
                raise ValueError(f"column {name!r}: {len(values)} values for {n} completions")
        per_func = [select_columns(fn, {**call_kwargs, **columns}) for fn in reward_funcs]
        per_func = [{k: v for k, v in chosen.items() if k in columns} for chosen in per_func]
        blob = pickle.dumps((list(reward_funcs), call_kwargs))
        return cls(pool, reward_funcs, prompts, completions, per_func, blob)

    def next_chunk(self, share: int) -> list[tuple]:
        """Calls for one worker: consecutive items of one function per call, as many as its batch size allows;
        up to _CHUNK completions (or one call of a larger batch size), and at most `share` (a worker's share of
        the items)."""
        cap = min(share, max(_CHUNK, self.batch_sizes[self.items[0][1]]))
        chunk, size = [], 0
        while self.items and size < cap:
            first = self.items.popleft()
            f = first[1]
            limit = 1 if first[0] in self.alone else min(self.batch_sizes[f], cap - size)
            call = [first]
            while self.items and len(call) < limit and self.items[0][1] == f and self.items[0][0] not in self.alone:
                call.append(self.items.popleft())
            rows = [item[4] for item in call]
            columns = {k: [row[k] for row in rows] for k in rows[0]}
            chunk.append((tuple(item[0] for item in call), f, [i[2] for i in call], [i[3] for i in call], columns))
            size += len(call)
        return chunk

    def put_back(self, tasks: Sequence[int]) -> None:
        """Items of `tasks` back to the front of the queue, in order."""
        self.items.extendleft(self.by_task[t] for t in reversed(tasks))

    def answered(self, tasks: tuple[int, ...], status: str, value: Any) -> None:
        if status == "ok":
            for task, reward in zip(tasks, value, strict=True):
                self.scores.rewards[task // self.n][task % self.n] = reward
        elif status == "infrastructure" and len(tasks) == 1:
            self.pool._infrastructure(self, tasks[0], value)
        else:
            self.failed(tasks, "error", value)

    def failed(self, tasks: tuple[int, ...], kind: str, message: str) -> None:
        """A call that raised, hung or crashed: a call of several is made again one completion at a time; a call
        of one costs its completion (a ProgramFailure of the function's lowest reward)."""
        f, i = divmod(tasks[0], self.n)
        if len(tasks) > 1:
            log.warning(
                "reward %s failed on a call of %d completions (%s): scoring them one at a time; %s",
                self.names[f], len(tasks), kind, message.strip()[-300:],
            )  # fmt: skip
            self.alone.update(tasks)
            self.put_back(tasks)
            return
        self.scores.rewards[f][i] = ProgramFailure(self.lowest[f], f"{kind}: {message.strip()[-300:]}")
        self.scores.failures.append(Failure(self.names[f], i, kind, message, f))
        log.warning("reward %s failed on completion %d (%s): %s", self.names[f], i, kind, message.strip()[-500:])

    def record_infrastructure(self, task: int, message: str) -> str:
        """The verifier could not score this completion (its reward stays None); returns the function's name."""
        f, i = divmod(task, self.n)
        self.scores.failures.append(Failure(self.names[f], i, "infrastructure", message, f, "infrastructure"))
        log.error("reward %s could not score completion %d (infrastructure): %s", self.names[f], i, message[-500:])
        return self.names[f]


class RewardPool:
    """A pool of verifier processes; reuse one across training steps (start-up costs ~1 s per worker).

    workers: processes (default: 2). timeout: seconds one completion may take in one reward function.
    failure_reward: reward of a completion whose verifier hung, crashed or raised (None = the function's
    lowest reward, see module doc). max_infra_failures: infrastructure failures (None rewards) the pool
    tolerates in its life before it raises InfrastructureError.
    """

    def __init__(
        self,
        workers: int = 2,
        timeout: float = 30.0,
        failure_reward: float | None = None,
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
        self._workers = [_Worker() for _ in range(workers)]
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
        job = _Job.of(reward_funcs, prompts, completions, dict(columns or {}), dict(call_kwargs or {}), self)
        self._batch += 1
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
                    tasks = w.pending.popleft()
                    budget = _call_budget(self.timeout, len(tasks))
                    job.scores.add_call(tasks[0] // job.n, budget)
                    job.failed(tasks, "timeout", f"no result within {budget} s")
                    self._replace(w, job)
        job.scores.seconds = time.perf_counter() - start
        return job.scores

    def _hand_out(self, job: _Job) -> None:
        """A chunk of calls to every ready, idle worker (at most its share of the items; with the batch's
        functions, the first time)."""
        share = -(-len(job.items) // len(self._workers))
        for w in self._workers:
            if not (w.ready and job.items and not w.pending):
                continue
            chunk = job.next_chunk(share)
            loading = w.batch != self._batch
            try:
                w.conn.send((self._batch, job.blob if loading else None, chunk, self.timeout))
            except OSError:  # it died while idle (killed from outside): no item of it was lost
                job.put_back([task for call in chunk for task in call[0]])
                self._replace(w, job)
                continue
            w.batch = self._batch
            w.pending.extend(call[0] for call in chunk)
            w.deadline = time.monotonic() + (_STARTUP_S if loading else self._budget(w))

    def _budget(self, worker: _Worker) -> float:
        return _call_budget(self.timeout, len(worker.pending[0])) if worker.pending else self.timeout

    def _receive(self, w: _Worker, job: _Job) -> None:
        """Read one message of `w`: it is ready, it loaded the batch, a call's results, or it died (a crash on
        its current call, or a death at start-up)."""
        try:
            message = w.conn.recv()
        except (EOFError, OSError):
            w.proc.join(1.0)
            if not w.ready:  # killed from outside (OOM) once: replaced; every time: broken
                self._startup_deaths += 1
                if self._startup_deaths >= _STARTUP_ATTEMPTS:
                    raise RuntimeError(
                        f"reward worker died at start-up {self._startup_deaths} times in a row (last exit code "
                        f"{w.proc.exitcode}): the reward modules do not import in a fresh process"
                    ) from None
            else:
                job.failed(w.pending.popleft(), "crash", f"worker died (exit code {w.proc.exitcode})")
            self._replace(w, job)
            return
        if message == "ready":
            w.ready = True
            self._startup_deaths = 0
            return
        if message != "loaded":
            tasks, status, value, seconds = message
            w.pending.popleft()
            job.scores.add_call(tasks[0] // job.n, seconds)
            job.answered(tasks, status, value)
        w.deadline = time.monotonic() + self._budget(w)

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
        job.put_back(worker.pending_tasks())
        self._workers[self._workers.index(worker)] = _Worker()

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
            w.conn.close()
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

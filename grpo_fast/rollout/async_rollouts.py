"""Asynchronous rollouts: the engine generates in a process of its own, on cores of its own, while the trainer
trains; complete groups reach the trainer through a bounded queue.

The engine process runs the partial-rollout round loop (grpo_fast.rollout.partial) without end: it starts
groups from the prompts the trainer sends, runs a round, and puts every complete group on the group queue
(waiting while the queue is full). Between rounds it takes new weights: the trainer copies its weights into
shared-memory tensors and announces the version; the engine loads them (the weight sync's completeness check
applies: `RolloutEngine.load_weights`) and publishes the version it holds. Generation pauses only for the copy.
The trainer writes version v + 1 only after the engine has loaded v, so the shared tensors are never read
while written.

Staleness is bounded twice: the engine restarts (or drops the group of) completions older than max_staleness
versions before each round, and the trainer drops any group that arrives older than that (counted, never
trained). The queue holds at most `queue_groups` groups, and the prompts sent ahead follow a fixed schedule,
`groups_in_flight` steps' worth, so that what a checkpoint's prompt sampler has drawn depends only on the step.

Faults: an engine process that dies, or raises (its traceback comes back), stops the run with a RuntimeError
naming it; no group within `timeout_seconds` does too, never a hang. Groups under way when the trainer stops
are discarded: a resumed run starts a new engine process from the checkpoint's weights, and the prompts that
were sent ahead but not trained are skipped, not trained twice.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from grpo_fast.config_fields import ConfigSection, option
from grpo_fast.rollout.base import SamplingSpec
from grpo_fast.rollout.partial import ROUND_SEEDS, PartialGroup, PartialOptions, PartialRollouts

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.05


@dataclass
class AsyncOptions(ConfigSection):
    """Asynchronous rollouts (`rollout.async_engine`, used when rollout.mode is async)."""

    key = "rollout.async_engine"
    queue_groups: int = option(32, "complete groups waiting for the trainer at most (the engine waits beyond)", low=1)
    threads: int = option(
        0, "CPU threads of the engine process (0: half the cores); on CPU it gets as many cores of its own", low=0
    )
    devices: str = option(
        "", "the engine process's GPUs (its CUDA_VISIBLE_DEVICES, e.g. \"1\"; empty: as the trainer's process)"
    )
    timeout_seconds: float = option(
        600.0,
        "seconds without word from the engine process (ready, a group) before the run stops with an error",
        low=0,
        low_open=True,
    )


@dataclass(frozen=True)
class EngineSpec:
    """How the engine process builds its engine: `kind` "hf" or "vllm", the model directory, and the vLLM
    engine's keyword arguments."""

    kind: str
    model_dir: str
    vllm_kwargs: dict = dataclasses.field(default_factory=dict)


def build_engine(spec: EngineSpec):
    """The engine of the engine process (grpo_fast.rollout.hf_engine / vllm_engine), from the model directory."""
    if spec.kind == "vllm":
        from grpo_fast.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(spec.model_dir, **spec.vllm_kwargs)
    if spec.kind == "hf":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from grpo_fast.rollout.hf_engine import HFEngine

        model = AutoModelForCausalLM.from_pretrained(spec.model_dir, dtype=torch.float32).eval().requires_grad_(False)
        return HFEngine(model, AutoTokenizer.from_pretrained(spec.model_dir), owns_model=True)
    raise ValueError(f"rollout.mode async: engine {spec.kind!r} cannot run in the engine process (hf or vllm)")


def _engine_main(
    spec: EngineSpec,
    pool_kwargs: dict,
    sampling: SamplingSpec,
    seed: int,
    threads: int,
    cores: set[int],
    devices: str,
    shared: dict[str, torch.Tensor],
    prompts: mp.Queue,
    groups: mp.Queue,
    control: mp.Queue,
    loaded,
) -> None:
    """The engine process: rounds of partial rollouts without end (see module doc). Puts ("ready",) once it holds
    the weights, then ("group", state, counts) for each complete group, counts since the last one (with
    "busy_seconds" generating, "idle_seconds" waiting for prompts or for room in the queue); ("error", traceback)
    on a failure."""
    parent = os.getppid()
    try:
        if devices:  # before CUDA starts in this process
            os.environ["CUDA_VISIBLE_DEVICES"] = devices
        if cores:
            os.sched_setaffinity(0, cores)
        torch.set_num_threads(max(1, len(cores) if cores else threads))
        engine = build_engine(spec)
        engine.load_weights(shared.items())  # the trainer's current weights (a resumed run's, not the directory's)
        groups.put(("ready",))
        pool = PartialRollouts(
            **pool_kwargs, sampling=lambda max_tokens, s: dataclasses.replace(sampling, max_tokens=max_tokens, seed=s)
        )
        version, rounds, stop = loaded.value, 0, False
        counts: Counter = Counter()  # since the last group sent, which carries them
        while not stop:
            version, stop = _take_control(engine, shared, control, loaded, version, parent)
            pool.enforce_staleness(version, counts)
            counts["started"] += pool.start(_drain(prompts))
            if not any(m.running for g in pool.groups for m in g.members):
                time.sleep(POLL_SECONDS)  # nothing to generate: wait for prompts
                counts["idle_seconds"] += POLL_SECONDS
                continue
            busy = time.perf_counter()
            counts["generated_tokens"] += pool.round(engine, version, seed + rounds * ROUND_SEEDS)
            counts["busy_seconds"] += time.perf_counter() - busy
            rounds += 1
            for group in pool.take_done(len(pool.groups)):
                waiting = time.perf_counter()
                while not stop:  # a full queue: wait, taking new weights meanwhile
                    try:
                        groups.put(("group", pool.group_state(group), dict(counts)), timeout=POLL_SECONDS)
                        counts = Counter()
                        break
                    except queue.Full:
                        version, stop = _take_control(engine, shared, control, loaded, version, parent)
                        counts["idle_seconds"] += time.perf_counter() - waiting
                        waiting = time.perf_counter()
        engine.close()
    except BaseException:  # noqa: BLE001 - every failure goes back to the trainer, which raises it
        groups.put(("error", traceback.format_exc()))
        raise


def _take_control(engine, shared, control: mp.Queue, loaded, version: int, parent: int) -> tuple[int, bool]:
    """Applies the trainer's messages: the newest announced weights (loaded from `shared`), or stop; stop too when
    the trainer process is gone (killed: nothing else would end this process)."""
    if os.getppid() != parent:
        return version, True
    newest = None
    while True:
        try:
            message = control.get_nowait()
        except queue.Empty:
            break
        if message[0] == "stop":
            return version, True
        newest = message[1]
    if newest is not None:
        engine.load_weights(shared.items())
        version = newest
        loaded.value = newest
    return version, False


def _drain(prompts: mp.Queue) -> list[tuple[int, list[int]]]:
    """The prompts waiting: (row, ids) each."""
    out = []
    while True:
        try:
            out.append(prompts.get_nowait())
        except queue.Empty:
            return out


class AsyncRollouts:
    """The trainer's side of the engine process (see module doc).

    pool_kwargs: PartialRollouts' options, num_generations, max_completion_length, max_staleness and stale;
    sampling: the run's SamplingSpec (n = 1); weights: the trainer's (name, tensor) pairs at version `version`,
    copied into shared memory here; `start` starts the process."""

    def __init__(
        self,
        options: AsyncOptions,
        spec: EngineSpec,
        pool_kwargs: dict,
        sampling: SamplingSpec,
        seed: int,
        weights: Iterable[tuple[str, torch.Tensor]],
        version: int,
    ) -> None:
        self.options, self.max_staleness = options, pool_kwargs["max_staleness"]
        self.partial: PartialOptions = pool_kwargs["options"]
        context = mp.get_context("spawn")
        self.shared = {name: t.detach().to("cpu", copy=True).share_memory_() for name, t in weights}
        self.prompts, self.control = context.Queue(), context.Queue()
        self.groups = context.Queue(maxsize=options.queue_groups)
        self.loaded = context.Value("q", version)
        self.pushed = version
        threads = options.threads or max(1, (os.cpu_count() or 2) // 2)
        self._restore = None
        cores = set()
        if not torch.cuda.is_available():  # on CPU, separate cores: the engine takes the last `threads`
            mine = sorted(os.sched_getaffinity(0))
            if len(mine) > threads:
                cores = set(mine[-threads:])
                self._restore = (set(mine), torch.get_num_threads())
                os.sched_setaffinity(0, set(mine[:-threads]))
                torch.set_num_threads(len(mine) - threads)
        self.process = context.Process(
            target=_engine_main,
            args=(
                spec,
                pool_kwargs,
                sampling,
                seed,
                threads,
                cores,
                options.devices,
                self.shared,
                self.prompts,
                self.groups,
                self.control,
                self.loaded,
            ),
            name="grpo_fast-engine",
            daemon=True,
        )
        self.sent = 0  # prompts sent, counted by the schedule (prompts_due)
        self.spec = spec

    def start(self) -> None:
        """Starts the engine process and waits until it holds the weights: its start-up is not a step's."""
        self.process.start()
        logger.info("rollout.mode async: engine process %d started (%s)", self.process.pid, self.spec)
        if self._next()[0] != "ready":
            raise RuntimeError("rollout.mode async: the engine process did not report ready first")

    def prompts_due(self, step: int, prompts_per_step: int) -> int:
        """Prompts the schedule has sent by the start of `step`: groups_in_flight steps ahead of the trainer."""
        return math.ceil((step + self.partial.groups_in_flight) * prompts_per_step)

    def send(self, drawn: list[tuple[int, list[int]]]) -> None:
        for item in drawn:
            self.prompts.put(item)
        self.sent += len(drawn)

    def collect(self, needed: int, version: int) -> tuple[list[PartialGroup], Counter, float]:
        """`needed` complete groups no older than version - max_staleness, in arrival order; (groups, counts,
        seconds waited). Counts: the engine's "generated_tokens", "started", "restarted", "dropped" since the
        last group, and "dropped_stale", groups that arrived too old."""
        out, counts, waited = [], Counter(), 0.0
        while len(out) < needed:
            t0 = time.perf_counter()
            kind, *payload = self._next()
            waited += time.perf_counter() - t0
            state, engine_counts = payload
            counts.update(engine_counts)
            group = PartialRollouts.group_from_state(state)
            if version - group.oldest_version(version) > self.max_staleness:
                counts["dropped_stale"] += 1
                continue
            out.append(group)
        return out, counts, waited

    def _next(self) -> tuple:
        """The next message of the engine process; RuntimeError when it failed, died or is silent too long."""
        deadline = time.monotonic() + self.options.timeout_seconds
        while True:
            try:
                message = self.groups.get(timeout=POLL_SECONDS * 4)
            except queue.Empty:
                if not self.process.is_alive():
                    self._raise_if_failed(wait=1.0)
                    raise RuntimeError(
                        f"rollout.mode async: the engine process died (exit code {self.process.exitcode}); the run "
                        "stops here (resume from the last checkpoint). A script that trains must start under "
                        "`if __name__ == '__main__':`, since the engine process is spawned and imports it"
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"rollout.mode async: nothing from the engine process in "
                        f"{self.options.timeout_seconds:g} s (rollout.async_engine.timeout_seconds); it is stuck"
                    ) from None
                continue
            if message[0] == "error":
                raise RuntimeError(f"rollout.mode async: the engine process failed:\n{message[1]}")
            return message

    def push_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """`wait_for_engine`, then `write_weights`."""
        waited = self.wait_for_engine()
        return {**self.write_weights(weights, version), "sync/wait_engine": waited}

    def wait_for_engine(self) -> float:
        """Waits until the engine holds the last weights pushed (it may still be reading them); returns the seconds
        waited. RuntimeError when the engine process failed or died meanwhile."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.options.timeout_seconds
        while self.loaded.value != self.pushed:
            if not self.process.is_alive() or time.monotonic() > deadline:
                self._raise_if_failed()
                raise RuntimeError(
                    "rollout.mode async: the engine process did not take the last weights "
                    f"(exit code {self.process.exitcode})"
                )
            time.sleep(POLL_SECONDS / 5)
        return time.perf_counter() - t0

    def write_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Copies the trainer's weights into the shared tensors (the engine must hold the last ones:
        `wait_for_engine`) and announces `version`. Every shared tensor must come once, under its name."""
        t0 = time.perf_counter()
        nbytes, names, unknown = 0, set(), []
        with torch.no_grad():
            for name, tensor in weights:  # to the end whatever comes: on several ranks each item is a collective
                if name in self.shared:
                    self.shared[name].copy_(tensor)
                    nbytes += tensor.numel() * tensor.element_size()
                    names.add(name)
                else:
                    unknown.append(name)
        missing = sorted(set(self.shared) - names)
        if unknown or missing:
            raise RuntimeError(
                f"rollout.mode async: the weight sync named {unknown[:5]}, which the engine process does not hold, "
                f"and left out {missing[:5]}; the engine keeps the last weights"
            )
        self.control.put(("weights", version))
        self.pushed = version
        return {"sync/seconds": time.perf_counter() - t0, "sync/bytes": float(nbytes)}

    def _raise_if_failed(self, wait: float = 0.0) -> None:
        """Raises the engine process's failure if its message is (or within `wait` seconds comes) next."""
        try:
            message = self.groups.get(timeout=wait) if wait else self.groups.get_nowait()
        except queue.Empty:
            return
        if message[0] == "error":
            raise RuntimeError(f"rollout.mode async: the engine process failed:\n{message[1]}")

    def close(self, grace_seconds: float = 30.0) -> None:
        """Stops the engine process (it finishes its round), killing it if it has not stopped in `grace_seconds`."""
        if self.process.is_alive():
            self.control.put(("stop",))
        deadline = time.monotonic() + grace_seconds
        while self.process.is_alive() and time.monotonic() < deadline:
            try:  # drain: a process blocked on a full queue cannot see the stop
                self.groups.get(timeout=POLL_SECONDS)
            except queue.Empty:
                pass
        if self.process.is_alive():
            self.process.kill()
        if self.process.pid is not None:  # started
            self.process.join()
        if self._restore is not None:  # the trainer's cores and threads as they were
            os.sched_setaffinity(0, self._restore[0])
            torch.set_num_threads(self._restore[1])
            self._restore = None

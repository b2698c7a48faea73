"""Asynchronous rollouts: the engine generates in a process of its own, on cores or GPUs of its own, on this host
or another, while the trainer trains; complete groups reach the trainer through a bounded queue.

The engine process runs the partial-rollout round loop (grpo_fast.rollout.partial) without end: it starts
groups from the prompts the trainer sends, runs a round, and puts every complete group on the group queue
(waiting while the queue is full). It builds the run's engine (any registered one: its `from_config` with this
process's model and tokenizer, loaded from the model directory) and the run's rollout kind from plain data
(`EngineSpec`): multi-turn rollouts run their tools and keep their environments here, so a tool call's latency
overlaps the trainer's steps; a group carries its conversations, never an environment instance. Between rounds it
takes new weights: the trainer copies its weights into a staging copy, announces the version and broadcasts the
copy (grpo_fast.rollout.engine_link: gloo between CPUs, NCCL between GPUs); the engine receives and loads them (the
weight sync's completeness check applies: `RolloutEngine.load_weights`) and publishes the version it holds.
Generation pauses only for the transfer and the load. The trainer stages version v + 1 only after the engine has
loaded v.

The trainer starts the engine process itself (`launch: spawn`), or waits for one started apart, on any host that
reaches its `address` (`launch: external`, `grpo-fast engine --connect HOST:PORT --secret-file FILE`): messages
and weights travel over TCP, nothing is shared but the address and the run's secret. The link listens on loopback
unless `address` names another interface, and serves only peers that prove the secret; its messages are the
dataclasses of grpo_fast.rollout.async_messages (grpo_fast.rollout.link_store, engine_link).

With `engines` > 1 several engine processes generate side by side (data parallel): each takes the next index as it
connects, gets every `engines`-th prompt the trainer sends and seeds of its own, and receives every weight version
(one broadcast to all); their groups share the queue. The trainer's next weights wait for every engine to hold
the last ones.

Staleness is bounded twice: the engine restarts (or drops the group of) completions older than max_staleness
versions before each round, and the trainer drops any group that arrives older than that (counted, never
trained). The queue holds at most `queue_groups` groups, and the prompts sent ahead follow a fixed schedule,
`groups_in_flight` steps' worth, so that what a checkpoint's prompt sampler has drawn depends only on the step.

Faults: an engine process that raises stops the run with its traceback; one that dies (spawned) or is silent for
`timeout_seconds` (either launch) stops it with an error naming it, never a hang. An engine process whose trainer
is gone stops. Groups under way when the trainer stops are discarded: a resumed run starts a new engine process
from the checkpoint's weights, and the prompts that were sent ahead but not trained are skipped, not trained twice.
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
import typing
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from grpo_fast.config_fields import MAX_WAIT_SECONDS, ConfigSection, build, option
from grpo_fast.data.tokenizer import load_tokenizer
from grpo_fast.rollout.async_messages import CONTROL, FROM_ENGINE, PROMPTS, Failure, Group, Prompt, Ready, Stop, Weights
from grpo_fast.rollout.base import RolloutEngine, SamplingSpec
from grpo_fast.rollout.engine_link import BACKENDS, Manifest, WeightLink, WeightSender
from grpo_fast.rollout.link_auth import SECRET_ENV, LinkClosed, new_secret, parse_secret, write_secret_file
from grpo_fast.rollout.link_codec import LinkProtocolError, decode, encode, from_plain, to_plain
from grpo_fast.rollout.link_store import Channel, LinkServer, connect_link, parse_address
from grpo_fast.rollout.partial import ROUND_SEEDS, PartialGroup, PartialOptions, PartialRollouts
from grpo_fast.rollout.registry import ROLLOUT_ENGINES
from grpo_fast.rollout.rollouts import rollouts_from_recipe
from grpo_fast.rollout.weight_check import WeightNameCheck

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.05
LAUNCHES = ("spawn", "external")


@dataclass
class AsyncOptions(ConfigSection):
    """Asynchronous rollouts (`rollout.async_engine`, used when rollout.mode is async)."""

    key = "rollout.async_engine"
    queue_groups: int = option(32, "complete groups waiting for the trainer at most (the engine waits beyond)", low=1)
    engines: int = option(
        1,
        "engine processes generating side by side, each sent every engines-th prompt, each taking every weight "
        "version (launch external: start as many)",
        low=1,
    )
    threads: int = option(
        0,
        "CPU threads of each engine process (0: half the cores over the engines); on CPU it gets as many cores of "
        "its own",
        low=0,
    )
    devices: str = option(
        "", "the engine process's GPUs (its CUDA_VISIBLE_DEVICES, e.g. \"1\"; empty: as the trainer's process)"
    )
    timeout_seconds: float = option(
        600.0,
        "seconds without word from the engine process (ready, a group, a weight transfer) before the run stops with "
        "an error",
        low=0,
        high=MAX_WAIT_SECONDS,
        low_open=True,
    )
    launch: str = option(
        "spawn",
        "spawn: the trainer starts the engine process on its own host; external: the trainer waits for one started "
        "apart, on this host or another, with `grpo-fast engine --connect HOST:PORT --secret-file FILE` (as logged)",
        choices=LAUNCHES,
    )
    address: str = option(
        "",
        "HOST:PORT where the trainer listens for its engine processes (that interface only; empty: loopback, a free "
        "port, as logged). Set it for an engine on another host, e.g. node0:29600; peers must hold the run's secret",
    )
    weight_backend: str = option(
        "auto",
        "how the weights travel to the engine process: gloo, nccl, or auto (nccl from the trainer's GPU to an engine "
        "with GPUs of its own: devices set, or launch external)",
        choices=BACKENDS,
    )

    def listen_address(self) -> tuple[str, int]:
        """(host, port) the trainer's link listens on (port 0: a free one): loopback unless `address` names one."""
        if self.address:
            return parse_address(self.address, "rollout.async_engine.address")
        return "127.0.0.1", 0


@dataclass(frozen=True)
class EngineSpec:
    """How the engine process builds its engine and rollouts, as plain data: `engine`, a registered engine name or
    "package.module:Class"; the model directory; the engine's `options` section; `config`, what its from_config
    reads of the run config (the rollout section and run.seed); `rollouts`, the rollout kind's recipe
    (grpo_fast.rollout.rollouts.rollouts_from_recipe)."""

    engine: str
    model_dir: str
    options: dict = dataclasses.field(default_factory=dict)
    config: dict = dataclasses.field(default_factory=dict)
    rollouts: dict = dataclasses.field(default_factory=lambda: {"kind": "single_turn"})

    def weight_dtype(self) -> torch.dtype | None:
        """The dtype the engine holds its weights in, when the spec fixes it (None: the trainer's): an engine that
        generates with the model it is given holds this process's fp32 copy; another its options' dtype."""
        if ROLLOUT_ENGINES.get(self.engine).shares_trainer_model:
            return torch.float32
        name = self.options.get("dtype", "auto")
        return None if name == "auto" else getattr(torch, name)


@dataclass(frozen=True)
class EngineSetup:
    """What the trainer leaves in its store for the engine processes: the engine, the partial-rollout pool's keyword
    arguments, the sampling and seed, threads and GPUs, the queue bound, the weights' manifest and transport, the
    weight version it starts from, the timeout of every wait, and how many engine processes there are."""

    spec: EngineSpec
    pool_kwargs: dict
    sampling: SamplingSpec
    seed: int
    threads: int
    devices: str
    queue_groups: int
    manifest: Manifest
    backend: str
    version: int
    timeout_seconds: float
    engines: int = 1

    def to_plain(self) -> dict:
        """The setup as plain data (grpo_fast.rollout.link_codec), what crosses the link."""
        return to_plain(self)

    @classmethod
    def from_plain(cls, plain) -> EngineSetup:
        """The setup from `to_plain`'s data, every field checked against its type, the pool's keyword arguments
        against PartialRollouts' parameters; LinkProtocolError naming the first that does not fit."""
        setup = from_plain(plain, cls, "setup")
        hints = typing.get_type_hints(PartialRollouts.__init__)
        unknown = sorted(set(setup.pool_kwargs) - (set(hints) - {"sampling", "dist", "return"}))
        if unknown:
            raise LinkProtocolError(f"setup.pool_kwargs: unknown keyword(s) {unknown} of PartialRollouts")
        pool = {k: from_plain(v, hints[k], f"setup.pool_kwargs.{k}") for k, v in setup.pool_kwargs.items()}
        return dataclasses.replace(setup, pool_kwargs=pool)


def build_engine(spec: EngineSpec) -> tuple[RolloutEngine, Callable[[Iterable], object], object]:
    """The engine process's engine, built by its class's from_config with this process's tokenizer (and model, for
    an engine that generates with the model it is given) from the model directory; -> (engine, load, tokenizer),
    load(weights) putting the trainer's weights where the engine generates from."""
    from transformers import AutoModelForCausalLM

    os.environ["WORLD_SIZE"] = "1"  # one process of its own, whatever launched the trainer (no torchrun executor)
    engine_cls = ROLLOUT_ENGINES.get(spec.engine)
    tokenizer = load_tokenizer(spec.model_dir)  # as the trainer loads it (its saved class)
    model = None
    if engine_cls.shares_trainer_model:
        model = AutoModelForCausalLM.from_pretrained(spec.model_dir, dtype=torch.float32).eval().requires_grad_(False)
    options = build(engine_cls.options, spec.options, f"rollout.engine {spec.engine}") if engine_cls.options else None
    engine = engine_cls.from_config(
        _config_view(spec.config),
        options=options,
        model=model,
        tokenizer=tokenizer,
        export_model=lambda: spec.model_dir,
    )
    if engine.shares_trainer_model:  # its load_weights is a no-op: the weights go into the model it was given
        return engine, lambda weights: _load_into(model, weights), tokenizer
    return engine, engine.load_weights, tokenizer


def _load_into(model, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copies the trainer's weights into this process's model; every parameter must come once, under its name."""
    params = dict(model.named_parameters())
    check = WeightNameCheck(params, "the engine process's model")
    for name, tensor in check.stream(weights):
        params[name].data.copy_(tensor)
    check.raise_if_incomplete()


def _config_view(data: dict) -> SimpleNamespace:
    """Attribute access to the plain-data run config of an EngineSpec (config.rollout.max_model_len, config.run.seed,
    ...) for from_config; `plugins` stays a mapping."""
    return SimpleNamespace(
        **{k: v if not isinstance(v, dict) or k == "plugins" else _config_view(v) for k, v in data.items()}
    )


def run_engine(
    address: str,
    *,
    secret: bytes,
    parent: int | None = None,
    cores: set[int] | None = None,
    model_dir: str | None = None,
    devices: str | None = None,
    threads: int | None = None,
    connect_seconds: float = 600.0,
) -> None:
    """The engine process, connected to the trainer's link at `address` with the run's `secret`: rounds of partial
    rollouts without end (see module doc). Puts Ready on the group queue once it holds the weights, then a Group
    for each complete group, with the counts since the last one ("busy_seconds" generating, "idle_seconds" waiting
    for prompts or for room in the queue); Failure on a failure. Stops on the trainer's word, or when the trainer is
    gone (`parent`, its pid when spawned by it; any launch: its link is closed).

    model_dir, devices, threads: this host's, when they differ from the trainer's settings (the weights are the
    trainer's in any case); cores: the CPU cores of its own."""
    store = connect_link(address, secret, connect_seconds)
    setup = EngineSetup.from_plain(decode(store.get("setup")))
    index = store.add("engine_index", 1) - 1  # in the order the engine processes connect
    if index >= setup.engines:
        raise RuntimeError(
            f"rollout.mode async: the trainer at {address} has its {setup.engines} engine process(es) "
            "(rollout.async_engine.engines); this one is not needed"
        )
    groups = Channel(store, "groups", FROM_ENGINE, setup.queue_groups)
    try:
        devices = setup.devices if devices is None else devices
        if devices:  # before CUDA starts in this process
            os.environ["CUDA_VISIBLE_DEVICES"] = devices
        if cores:
            os.sched_setaffinity(0, cores)
        torch.set_num_threads(max(1, threads or (len(cores) if cores else setup.threads)))
        link = WeightLink(
            store,
            index + 1,
            setup.engines + 1,
            setup.manifest,
            setup.backend,
            "cuda" if setup.backend == "nccl" else "cpu",
            setup.timeout_seconds,
        )
        weights = link.receive()  # the trainer's current weights (a resumed run's, not the directory's)
        spec = setup.spec if model_dir is None else dataclasses.replace(setup.spec, model_dir=model_dir)
        engine, load, tokenizer = build_engine(spec)
        load(weights)
        kind = rollouts_from_recipe(spec.rollouts, tokenizer)
        groups.put(Ready())
        try:
            _generate(engine, load, kind, setup, store, link, groups, parent, index)
        finally:
            kind.close()
            engine.close()
    except LinkClosed:  # the trainer's link is closed, and with it the trainer gone
        logger.info("rollout.mode async: the trainer at %s is gone; the engine process stops", address)
    except BaseException:  # noqa: BLE001 - every other failure goes back to the trainer, which raises it
        groups.put(Failure(traceback.format_exc()))
        raise


def _generate(
    engine, load, kind, setup: EngineSetup, store, link: WeightLink, groups: Channel, parent: int | None, index: int
) -> None:
    """The round loop of engine process `index` (its `engine`, `load` for the weights, the rollout `kind`), until the
    trainer says stop or is gone."""
    sampling, prompts = setup.sampling, Channel(store, f"prompts/{index}", PROMPTS)
    control = Channel(store, f"control/{index}", CONTROL)
    pool = PartialRollouts(
        **setup.pool_kwargs,
        sampling=lambda max_tokens, s: dataclasses.replace(sampling, max_tokens=max_tokens, seed=s),
        kind=kind,
    )

    def take_control(version: int) -> tuple[int, bool]:
        """Applies the trainer's messages: each announced version's weights, received and loaded, or stop; stop too
        when the spawning trainer process is gone (killed: nothing else would end this process)."""
        if parent is not None and os.getppid() != parent:
            return version, True
        for message in control.drain():
            if isinstance(message, Stop):
                return version, True
            load(link.receive())
            version = message.version
            store.set(f"loaded/{index}", str(version))
        return version, False

    version, rounds, stop = setup.version, 0, False
    counts: Counter = Counter()  # since the last group sent, which carries them
    while not stop:
        version, stop = take_control(version)
        pool.enforce_staleness(version, counts)
        counts["started"] += pool.start([(p.row, p.prompt_ids, p.data) for p in prompts.drain()])
        if not any(m.running for g in pool.groups for m in g.members):
            time.sleep(POLL_SECONDS)  # nothing to generate: wait for prompts
            counts["idle_seconds"] += POLL_SECONDS
            continue
        busy = time.perf_counter()
        round_seed = setup.seed + (rounds * setup.engines + index) * ROUND_SEEDS  # no two engines share a seed
        pool.round(engine, version, round_seed, counts)
        counts["busy_seconds"] += time.perf_counter() - busy
        rounds += 1
        for group in pool.take_done(len(pool.groups), version):  # every complete group, as soon as it is
            waiting = time.perf_counter()
            while not stop and groups.full():  # a full queue: wait, taking new weights meanwhile
                time.sleep(POLL_SECONDS)
                version, stop = take_control(version)
            counts["idle_seconds"] += time.perf_counter() - waiting
            if stop:
                break
            if setup.engines > 1:
                counts[f"groups_engine_{index}"] += 1
            groups.put(Group(pool.group_state(group), dict(counts)))
            counts = Counter()


class AsyncRollouts:
    """The trainer's side of the engine processes (see module doc).

    pool_kwargs: PartialRollouts' options, num_generations, max_completion_length, max_staleness and stale;
    sampling: the run's SamplingSpec (n = 1); weights: the trainer's (name, tensor) pairs at version `version`,
    staged here; `start` starts the processes (launch spawn) or waits for them (external).

    The link's secret is $GRPO_FAST_LINK_SECRET when set, else a new one: handed to each spawned process through
    its spawn pipe, or (launch external) written to `secret_file` (mode 0600, removed at `close`), whose path
    `engine_command` names."""

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
        self.options, self.max_staleness, self.spec = options, pool_kwargs["max_staleness"], spec
        self.partial: PartialOptions = pool_kwargs["options"]
        host, port = options.listen_address()
        text = os.environ.get(SECRET_ENV)
        self.secret = new_secret().encode() if text is None else parse_secret(text, f"${SECRET_ENV}")
        self.server = LinkServer(host, port, self.secret, options.timeout_seconds)
        external = text is None and options.launch == "external"
        self.secret_file = write_secret_file(self.secret.decode()) if external else None
        self.store = self.server.store
        self.address = f"{host}:{self.server.port}"
        engine_has_gpus = bool(options.devices) or options.launch == "external"
        self.sender = WeightSender(
            self.store,
            weights,
            options.weight_backend,
            engine_has_gpus,
            options.timeout_seconds,
            spec.weight_dtype(),
            options.engines,
        )
        engines = range(options.engines)
        self.prompts = [Channel(self.store, f"prompts/{k}", PROMPTS) for k in engines]
        self.control = [Channel(self.store, f"control/{k}", CONTROL) for k in engines]
        self.groups = Channel(self.store, "groups", FROM_ENGINE, options.queue_groups)
        threads = options.threads or max(1, (os.cpu_count() or 2) // (2 * options.engines))
        setup = EngineSetup(
            spec,
            pool_kwargs,
            sampling,
            seed,
            threads,
            options.devices,
            options.queue_groups,
            self.sender.manifest,
            self.sender.backend,
            version,
            options.timeout_seconds,
            options.engines,
        )
        self.store.set("setup", encode(setup.to_plain()))
        for k in engines:
            self.store.set(f"loaded/{k}", str(version))
        self.pushed = version
        self.ready = False
        self.processes: list[mp.Process] = []
        self._restore = None
        if options.launch == "spawn":
            cores = sorted(self._own_cores(threads * options.engines))
            self.processes = [
                mp.get_context("spawn").Process(
                    target=run_engine,
                    args=(self.address,),
                    kwargs=dict(
                        secret=self.secret, parent=os.getpid(), cores=set(cores[k * threads : (k + 1) * threads])
                    ),
                    name=f"grpo_fast-engine-{k}",
                    daemon=True,
                )
                for k in engines
            ]
        self.sent = 0  # prompts sent, counted by the schedule (prompts_due)
        self.dealt = 0  # prompts sent in all

    def engine_command(self) -> str:
        """The command that starts an engine process of this run apart."""
        secret = f" --secret-file {self.secret_file}" if self.secret_file else f" (with ${SECRET_ENV} as set here)"
        return f"grpo-fast engine --connect {self.address}{secret}"

    def _own_cores(self, threads: int) -> set[int]:
        """On CPU, the engines' cores: the last `threads` of the trainer's, which keeps the others (restored at
        close); none on a GPU machine or with too few cores."""
        mine = sorted(os.sched_getaffinity(0))
        if torch.cuda.is_available() or len(mine) <= threads:
            return set()
        self._restore = (set(mine), torch.get_num_threads())
        os.sched_setaffinity(0, set(mine[:-threads]))
        torch.set_num_threads(len(mine) - threads)
        return set(mine[-threads:])

    def start(self) -> None:
        """Starts the engine processes (or waits for those started apart), sends them the weights, and waits until
        they hold them: their start-up is not a step's."""
        for process in self.processes:
            process.start()
            logger.info("rollout.mode async: engine process %d started (%s)", process.pid, self.spec)
        if not self.processes:
            notes = [" (that file holds the run's secret: copy it keeping its mode 0600)"] if self.secret_file else []
            if self.server.loopback:
                notes.append("; the link listens on loopback: for another host, set rollout.async_engine.address")
            logger.warning(
                "rollout.mode async: waiting %g s for %d engine process(es); start each with `%s` on a host that "
                "reaches this one%s",
                self.options.timeout_seconds,
                self.options.engines,
                self.engine_command(),
                "".join(notes),
            )
        self.sender.send()
        for _ in range(self.options.engines):
            if not isinstance(self._next(), Ready):
                raise RuntimeError("rollout.mode async: an engine process did not report ready first")
        self.ready = True
        self.sender.finish()

    def prompts_due(self, step: int, prompts_per_step: int) -> int:
        """Prompts the schedule has sent by the start of `step`: groups_in_flight steps ahead of the trainer."""
        return math.ceil((step + self.partial.groups_in_flight) * prompts_per_step)

    def send(self, drawn: list[tuple], scheduled: bool = True) -> None:
        """Sends (row, prompt ids[, row data]), the i-th sent to engine i mod engines; `scheduled`: counted by the
        schedule (prompts_due), else extra (grpo.dynamic_sampling's replacements)."""
        for i, (row, prompt_ids, *data) in enumerate(drawn, start=self.dealt):
            self.prompts[i % self.options.engines].put(Prompt(row, list(prompt_ids), data[0] if data else None))
        self.dealt += len(drawn)
        self.sent += len(drawn) if scheduled else 0

    def collect(self, needed: int, version: int) -> tuple[list[PartialGroup], Counter, float]:
        """`needed` complete groups no older than version - max_staleness, in arrival order; (groups, counts,
        seconds waited). Counts: the engine's "generated_tokens", "started", "restarted", "dropped" since the
        last group, and "dropped_stale", groups that arrived too old."""
        out, counts, waited = [], Counter(), 0.0
        while len(out) < needed:
            t0 = time.perf_counter()
            message = self._next()
            waited += time.perf_counter() - t0
            self._receive(message, version, out, counts)
        return out, counts, waited

    def take_ready(self, limit: int, version: int) -> tuple[list[PartialGroup], Counter]:
        """`collect` without waiting: at most `limit` of the groups already in the queue."""
        out, counts = [], Counter()
        while len(out) < limit:
            try:
                message = self.groups.get_nowait()
            except queue.Empty:
                break
            self._receive(self._checked(message), version, out, counts)
        return out, counts

    def _receive(self, message: Group, version: int, out: list[PartialGroup], counts: Counter) -> None:
        """A group message into `out` (or counted as "dropped_stale"), its engine counts into `counts`."""
        counts.update(message.counts)
        group = PartialRollouts.group_from_state(message.state)
        if version - group.oldest_version(version) > self.max_staleness:
            counts["dropped_stale"] += 1
        else:
            out.append(group)

    def _next(self) -> Ready | Group:
        """The next message of the engine process; RuntimeError when it failed, died or is silent too long."""
        deadline = time.monotonic() + self.options.timeout_seconds
        while True:
            try:
                message = self.groups.get(timeout=POLL_SECONDS * 4)
            except queue.Empty:
                dead = self._dead()
                if dead is not None:
                    self._raise_if_failed(wait=1.0)
                    raise RuntimeError(
                        f"rollout.mode async: the engine process died (exit code {dead.exitcode}); the run "
                        "stops here (resume from the last checkpoint). A script that trains must start under "
                        "`if __name__ == '__main__':`, since the engine process is spawned and imports it"
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(self._silence()) from None
                continue
            return self._checked(message)

    @staticmethod
    def _checked(message: Ready | Group | Failure) -> Ready | Group:
        """`message`, unless it is the engine process's failure: then RuntimeError with its traceback."""
        if isinstance(message, Failure):
            raise RuntimeError(f"rollout.mode async: the engine process failed:\n{message.traceback}")
        return message

    def _dead(self) -> mp.Process | None:
        """A spawned engine process that is no longer alive, if any."""
        return next((p for p in self.processes if not p.is_alive()), None)

    def _silence(self) -> str:
        seconds = f"{self.options.timeout_seconds:g} s (rollout.async_engine.timeout_seconds)"
        if self.ready or self.processes:
            return f"rollout.mode async: nothing from the engine process in {seconds}; it is stuck or gone"
        return (
            f"rollout.mode async: no engine process connected to {self.address} in {seconds}; start one with "
            f"`{self.engine_command()}` on a host that reaches this one"
        )

    def push_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """`wait_for_engine`, then `write_weights`."""
        waited = self.wait_for_engine()
        return {**self.write_weights(weights, version), "sync/wait_engine": waited}

    def loaded(self) -> int:
        """The oldest weight version an engine process holds."""
        return min(int(self.store.get(f"loaded/{k}")) for k in range(self.options.engines))

    def wait_for_engine(self) -> float:
        """Waits until every engine holds the last weights pushed; returns the seconds waited. RuntimeError when an
        engine process failed, died or stayed silent meanwhile."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.options.timeout_seconds
        while self.loaded() != self.pushed:
            dead = self._dead()
            if dead is not None or time.monotonic() > deadline:
                self._raise_if_failed()
                exit_code = f" (exit code {dead.exitcode})" if dead is not None else ""
                raise RuntimeError(f"rollout.mode async: the engine process did not take the last weights{exit_code}")
            time.sleep(POLL_SECONDS / 5)
        self.sender.finish()
        return time.perf_counter() - t0

    def write_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Stages the trainer's weights (the engine must hold the last ones: `wait_for_engine`), announces
        `version` and sends them. Every staged tensor must come once, under its name."""
        t0 = time.perf_counter()
        nbytes = self.sender.stage(weights)
        for control in self.control:
            control.put(Weights(version))
        self.sender.send()
        self.pushed = version
        return {"sync/seconds": time.perf_counter() - t0, "sync/bytes": float(nbytes)}

    def _raise_if_failed(self, wait: float = 0.0) -> None:
        """Raises the engine process's failure if its message is (or within `wait` seconds comes) next."""
        try:
            message = self.groups.get(timeout=wait) if wait else self.groups.get_nowait()
        except queue.Empty:
            return
        self._checked(message)

    def close(self, grace_seconds: float = 30.0) -> None:
        """Stops the engine processes (each finishes its round), killing a spawned one that has not stopped in
        `grace_seconds`; an external one stops at its next round, or when the link closes (here, at the end)."""
        for control in self.control:
            control.put(Stop())
        for process in self.processes:
            if process.pid is None:  # never started
                continue
            process.join(grace_seconds)
            if process.is_alive():
                process.kill()
                process.join()
        if self._restore is not None:  # the trainer's cores and threads as they were
            os.sched_setaffinity(0, self._restore[0])
            torch.set_num_threads(self._restore[1])
            self._restore = None
        self.server.close()
        if self.secret_file is not None:
            os.unlink(self.secret_file)
            self.secret_file = None

"""The engine process of asynchronous rollouts (grpo_fast.rollout.async_rollouts) with the real transformers
engine, spawned by the trainer or started apart with `grpo-fast engine --connect`: groups arrive whole with their
versions, the weights the trainer pushes (over gloo) are the ones the engine samples with, the queue stays bounded,
and a failing, dead or absent engine process is an error, never a hang."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections import Counter

import pytest
import torch

from grpo_fast.core.policy import build_sequence_batch, completion_logprobs
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model, save_tiny
from grpo_fast.rollout.async_rollouts import AsyncOptions, AsyncRollouts, EngineSpec, run_engine
from grpo_fast.rollout.base import SamplingSpec
from grpo_fast.rollout.partial import PartialOptions
from grpo_fast.rollout.weight_sync import trainer_weights

TOK = build_char_tokenizer()
G = 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(build_tiny_model(TOK, seed=5), TOK, tmp_path_factory.mktemp("async") / "model")


def _remote(
    model_dir,
    model,
    *,
    queue_groups=8,
    timeout=60.0,
    max_staleness=4,
    spec=None,
    launch="spawn",
    start=True,
    engines=1,
) -> AsyncRollouts:
    pool = dict(
        options=PartialOptions(segment_tokens=4, groups_in_flight=2.0),
        num_generations=G,
        max_completion_length=12,
        max_staleness=max_staleness,
        stale="restart",
    )
    remote = AsyncRollouts(
        AsyncOptions(queue_groups=queue_groups, threads=1, timeout_seconds=timeout, launch=launch, engines=engines),
        spec or EngineSpec("hf", str(model_dir)),
        pool,
        SamplingSpec(n=1, temperature=1.0),
        0,
        trainer_weights(model),
        0,
    )
    if start:
        remote.start()
    return remote


def _prompts(n: int, start: int = 0) -> list[tuple[int, list[int]]]:
    return [(start + i, TOK(f"({start + i}*7)%10=")["input_ids"]) for i in range(n)]


def test_groups_arrive_whole_and_sampled_by_the_pushed_weights(model_dir):
    """Version 0 is the model the process was started with; version 1 a different one pushed over the link: every
    token's behaviour logprob is the logprob under the weights of its segment's version."""
    models = {0: build_tiny_model(TOK, seed=5), 1: build_tiny_model(TOK, seed=6)}
    remote = _remote(model_dir, models[0])
    try:
        _check_sampled_by_pushed_weights(remote, models)
    finally:
        remote.close()


def test_two_engine_processes_share_the_prompts_and_take_every_weight_version(model_dir):
    """engines: 2: the prompts go to the engines in turn, both engines' groups reach the queue, and after the push
    every token of both is sampled by the weights of its segment's version."""
    models = {0: build_tiny_model(TOK, seed=5), 1: build_tiny_model(TOK, seed=6)}
    remote = _remote(model_dir, models[0], engines=2)
    try:
        counts = _check_sampled_by_pushed_weights(remote, models)
    finally:
        remote.close()
    assert counts["groups_engine_0"] > 0 and counts["groups_engine_1"] > 0
    assert not any(p.is_alive() for p in remote.processes)


def test_an_engine_process_beyond_the_configured_number_is_turned_away(model_dir):
    """A trainer with its one engine process: another that connects is told so and stops, and the run goes on."""
    remote = _remote(model_dir, build_tiny_model(TOK, seed=5))
    try:
        with pytest.raises(RuntimeError, match=r"has its 1 engine process\(es\) .*this one is not needed"):
            run_engine(remote.address, secret=remote.secret, connect_seconds=10.0)
        remote.send(_prompts(2))
        groups, _, _ = remote.collect(2, version=0)
        assert len(groups) == 2
    finally:
        remote.close()


def _check_sampled_by_pushed_weights(remote: AsyncRollouts, models: dict) -> Counter:
    """-> the engines' counts over the groups collected."""
    remote.send(_prompts(4))
    first, counts, _ = remote.collect(2, version=0)
    remote.push_weights(trainer_weights(models[1]), 1)
    remote.send(_prompts(6, start=4))
    later, counts_later, _ = remote.collect(6, version=1)
    counts.update(counts_later)
    groups = first + later
    assert all(len(g.members) == G and g.done for g in groups)
    assert counts["generated_tokens"] > 0
    seen = set()
    for group in groups:
        for m in group.members:
            comp = m.completion()
            batch = build_sequence_batch([group.prompt_ids], [comp.token_ids], TOK.pad_token_id)
            bounds = [s for s, _ in comp.segments[1:]] + [len(comp.token_ids)]
            for (start, version), end in zip(comp.segments, bounds, strict=True):
                with torch.no_grad():
                    lp = completion_logprobs(models[version], batch)[0, start:end]
                torch.testing.assert_close(torch.tensor(comp.logprobs[start:end]), lp, atol=2e-4, rtol=0)
                seen.add(version)
    assert seen == {0, 1}, "the test must see tokens of both versions"
    return counts


def test_an_engine_started_apart_takes_its_weights_over_tcp(model_dir, tmp_path):
    """launch external: `grpo-fast engine --connect` from another process, as on another host, with its own copy of
    a different model (seed 7): it samples with the trainer's weights, versions 0 and 1, all received over the
    link, with the secret in the file the trainer wrote (mode 0600). Closed, the trainer's side stops it, and it exits
    cleanly; the secret's file is gone."""
    models = {0: build_tiny_model(TOK, seed=5), 1: build_tiny_model(TOK, seed=6)}
    own_copy = save_tiny(build_tiny_model(TOK, seed=7), TOK, tmp_path / "engine_host_model")
    remote = _remote(model_dir, models[0], launch="external", start=False)
    secret_file = remote.secret_file
    assert stat.S_IMODE(os.stat(secret_file).st_mode) == 0o600
    command = [sys.executable, "-m", "grpo_fast.cli", "engine", "--connect", remote.address, "--threads", "1"]
    engine = subprocess.Popen([*command, "--secret-file", remote.secret_file, "--model-dir", str(own_copy)])
    try:
        remote.start()
        _check_sampled_by_pushed_weights(remote, models)
    finally:
        remote.close()
    assert not os.path.exists(secret_file)
    try:
        assert engine.wait(timeout=60) == 0
    finally:
        engine.kill()


def test_no_engine_started_apart_is_an_error_naming_the_command(model_dir):
    remote = _remote(model_dir, build_tiny_model(TOK, seed=5), launch="external", timeout=1.0, start=False)
    try:
        with pytest.raises(
            RuntimeError,
            match=r"no engine process connected to (\S+:\d+) in 1 s(.|\n)*"
            r"grpo-fast engine --connect \1 --secret-file \S+`",
        ):
            remote.start()
    finally:
        remote.close()


def test_the_queue_is_bounded(model_dir):
    model = build_tiny_model(TOK, seed=5)
    remote = _remote(model_dir, model, queue_groups=2)
    try:
        remote.send(_prompts(12))
        deadline = time.monotonic() + 30
        while remote.groups.qsize() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the engine has had time to finish more groups than the queue holds
        assert remote.groups.qsize() == 2
        assert remote.processes[0].is_alive()  # it waits, it does not fail
        groups, _, _ = remote.collect(6, version=0)
        assert len(groups) == 6
    finally:
        remote.close()
    assert not remote.processes[0].is_alive()


def test_a_failing_engine_process_raises_its_error(model_dir, tmp_path):
    with pytest.raises(RuntimeError, match="engine process failed(.|\n)*missing"):
        _remote(model_dir, build_tiny_model(TOK, seed=5), spec=EngineSpec("hf", str(tmp_path / "missing")))


def test_a_killed_engine_process_stops_the_run_without_a_hang(model_dir):
    remote = _remote(model_dir, build_tiny_model(TOK, seed=5), timeout=120.0)
    try:
        remote.send(_prompts(2))
        remote.collect(1, version=0)
        os.kill(remote.processes[0].pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="engine process died"):
            remote.collect(50, version=0)
        assert time.monotonic() - start < 10
        with pytest.raises(RuntimeError, match="did not take the last weights|died"):
            remote.push_weights(trainer_weights(build_tiny_model(TOK, seed=5)), 1)
            remote.push_weights(trainer_weights(build_tiny_model(TOK, seed=5)), 2)
    finally:
        remote.close()


def test_a_silent_engine_process_times_out(model_dir):
    remote = _remote(model_dir, build_tiny_model(TOK, seed=5))
    remote.options.timeout_seconds = 2.0
    try:  # no prompts sent: the process waits for them, and no group ever comes
        with pytest.raises(RuntimeError, match="nothing from the engine process in 2 s"):
            remote.collect(1, version=0)
    finally:
        remote.close()


def test_a_push_with_a_weight_missing_renamed_or_repeated_is_refused():
    """The staged copy takes a push only when it names every weight once (WeightNameCheck); a refused push announces
    nothing, so the engine keeps the last weights."""
    from grpo_fast.rollout.engine_link import WeightSender
    from grpo_fast.rollout.link_store import LinkServer

    weights = list(trainer_weights(build_tiny_model(TOK, seed=5)))
    server = LinkServer("127.0.0.1", 0, b"k" * 32, 5.0)
    sender = WeightSender(server.store, weights, "gloo", False, 5.0)
    before = {name: t.clone() for name, t in sender.staged.items()}
    (first, tensor), rest = weights[0], weights[1:]
    for push, problem in (
        (rest, "were not pushed"),
        ([("base_model." + first, tensor), *rest], "unknown to it"),
        ([*weights, (first, tensor)], "more than once"),
    ):
        with pytest.raises(RuntimeError, match=f"incomplete weight sync: .*{problem}"):
            sender.stage(push)
    assert sender.stage(weights) == sum(t.numel() * t.element_size() for _, t in weights)
    assert all(torch.equal(sender.staged[name], before[name]) for name in before)
    server.close()

"""Where tools and environments run and what a failure of theirs does, as TRL 1.16 runs them: sync tools in the
trainer's main thread one after another (a tool that uses signal.alarm, as TRL's own grpo_agent.py example's
does, works), each still bounded by its deadline; an async get_reward awaited; a public close a tool; an
environment whose method timed out discarded, never reset and reused. Real multi-turn rollouts on a locally
trained byte-level BPE tokenizer, the turns scripted (scripted_chat.py)."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest
from scripted_chat import ScriptedTurns, chatml_tokenizer, multi_turn, tool_call
from trl_agent_script import timeout

from grpo_fast.rollout.base import Completion, SamplingSpec
from grpo_fast.rollout.environments import environment_tools
from grpo_fast.rollout.multi_turn import MultiTurn

TIMEOUT = 0.5
CALLS: list[tuple[str, float, float]] = []  # (thread name, start, end) of every alarmed_lookup call


def alarmed_lookup(key: str) -> str:
    """Looks a key up, under its own 5 s alarm (the SIGALRM `timeout` of TRL's grpo_agent.py, trl_agent_script.py).

    Args:
        key: The key to look up.
    """
    start = time.perf_counter()
    with timeout(5):
        time.sleep(0.05)  # long enough for a second call to overlap, were calls run at once
    CALLS.append((threading.current_thread().name, start, time.perf_counter()))
    return key.upper()


def stubborn(seconds: float) -> str:
    """Sleeps under its own 5 s alarm, and swallows every Exception.

    Args:
        seconds: How long to sleep.
    """
    try:
        with timeout(5):
            time.sleep(seconds)
    except Exception:  # noqa: BLE001 - a tool that swallows errors must still stop at its deadline
        return "swallowed"
    return "slept"


def rollouts(tok, tools=(), environment=None, workers: int = 1, timeout: float = TIMEOUT) -> MultiTurn:
    return multi_turn(
        tok,
        tools,
        environment,
        max_iterations=4,
        max_completion_length=300,
        max_model_len=2048,
        timeout=timeout,
        workers=workers,
    )


def sampling(n: int) -> SamplingSpec:
    return SamplingSpec(n=n, max_tokens=300, temperature=1.0, seed=0)


def tool_results(completion) -> list[str]:
    return [m["content"] for m in completion.episode.messages if m["role"] == "tool"]


def test_sync_tools_run_in_the_main_thread_one_after_another_and_their_own_alarm_works():
    tok = chatml_tokenizer(["a", "b", "alarmed_lookup", "key"])
    script = {u: [tool_call("alarmed_lookup", key=u), "done"] for u in ("a", "b")}
    CALLS.clear()
    multi = rollouts(tok, [alarmed_lookup])
    try:
        out = multi.generate(ScriptedTurns(tok, script), [{"prompt": "a"}, {"prompt": "b"}], sampling(n=2))
    finally:
        multi.close()
    assert [tool_results(c) for c in out.completions] == [["A"], ["A"], ["B"], ["B"]]
    assert [name for name, _, _ in CALLS] == ["MainThread"] * 4
    spans = sorted((start, end) for _, start, end in CALLS)
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False))


def test_a_sync_tool_in_the_main_thread_stops_at_its_deadline_even_when_it_swallows_errors():
    tok = chatml_tokenizer(["s", "stubborn", "seconds"])
    multi = rollouts(tok, [stubborn])
    start = time.perf_counter()
    try:
        out = multi.generate(
            ScriptedTurns(tok, {"s": [tool_call("stubborn", seconds=30), "done"]}), [{"prompt": "s"}], sampling(1)
        )
    finally:
        multi.close()
    assert time.perf_counter() - start < 10  # the 30 s sleep was cut at the deadline, not at the tool's 5 s alarm
    (c,) = out.completions
    assert tool_results(c) == [f"error: stubborn: timed out after {TIMEOUT:g} s"] and c.episode.failures == {
        "stubborn": 1
    }
    assert signal.alarm(0) == 0  # the tool's own alarm was disarmed by its finally, none left pending


async def blocking(seconds: float) -> str:
    """An async tool that blocks its event loop (a sync sleep), so that no cancellation reaches it.

    Args:
        seconds: How long to block.
    """
    time.sleep(seconds)
    return "blocked"


async def shrugging(seconds: float) -> str:
    """An async tool that catches its cancellation and answers late.

    Args:
        seconds: How long to sleep.
    """
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        await asyncio.sleep(seconds)
    return "late"


def test_an_async_tool_past_its_deadline_times_out_however_it_overruns():
    """Blocking the loop (past the grace too: the next call gets a new loop) and swallowing the cancellation each
    returned late as a success (its environment kept)."""
    tok = chatml_tokenizer(["s", "blocking", "shrugging", "seconds"])
    for tool, seconds in ((blocking, 3.0), (shrugging, 0.6)):
        multi = rollouts(tok, [tool])
        script = {"s": [tool_call(tool.__name__, seconds=seconds), tool_call(tool.__name__, seconds=0.0), "done"]}
        try:
            (c,) = multi.generate(ScriptedTurns(tok, script), [{"prompt": "s"}], sampling(1)).completions
        finally:
            multi.close()
        timed_out = f"error: {tool.__name__}: timed out after {TIMEOUT:g} s"
        assert tool_results(c) == [timed_out, "blocked" if tool is blocking else "late"], tool.__name__


def test_parallel_tool_workers_are_opt_in_and_keep_the_deadline():
    tok = chatml_tokenizer(["s", "stubborn", "seconds"])
    script = {"s": [tool_call("stubborn", seconds=2), "done"]}
    multi = rollouts(tok, [stubborn], workers=2)
    try:
        out = multi.generate(ScriptedTurns(tok, script), [{"prompt": "s"}], sampling(2))
    finally:
        multi.close()
    # Off the main thread the tool's signal.alarm cannot work: it raises, which the model reads.
    assert {r for c in out.completions for r in tool_results(c)} == {"swallowed"}


class Counter:
    """An environment with an async reward and a public close, both as TRL allows them."""

    loops: list = []

    def reset(self, **row) -> None:
        self.value = 0

    async def bump(self, amount: int) -> str:
        """Adds to the counter.

        Args:
            amount: How much to add.
        """
        Counter.loops.append(asyncio.get_running_loop())
        self.value += amount
        return str(self.value)

    def close(self) -> str:
        """Closes the counter for this episode."""
        return "closed"

    async def get_reward(self) -> float:
        Counter.loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        return float(self.value)


def test_a_public_close_method_is_a_tool_as_in_trl():
    assert sorted(t.name for t in environment_tools(Counter())) == ["bump", "close"]
    tok = chatml_tokenizer(["x", "close", "closed"])
    multi = rollouts(tok, environment=Counter)
    try:
        out = multi.generate(ScriptedTurns(tok, {"x": [tool_call("close"), "done"]}), [{"prompt": "x"}], sampling(1))
    finally:
        multi.close()
    assert tool_results(out.completions[0]) == ["closed"]


def test_an_async_get_reward_is_awaited_on_the_loop_of_the_async_tools():
    tok = chatml_tokenizer(["x", "y", "bump", "amount"])
    script = {"x": [tool_call("bump", amount=3), tool_call("bump", amount=4), "done"], "y": ["no tools"]}
    Counter.loops.clear()
    multi = rollouts(tok, environment=Counter)
    try:
        out = multi.generate(ScriptedTurns(tok, script), [{"prompt": "x"}, {"prompt": "y"}], sampling(1))
    finally:
        multi.close()
    x, y = out.completions
    assert tool_results(x) == ["3", "7"]
    assert (x.episode.environment_reward, y.episode.environment_reward) == (7.0, 0.0)
    assert len(Counter.loops) == 4 and len(set(map(id, Counter.loops))) == 1


RELEASE, MUTATED = threading.Event(), threading.Event()


class Ledger:
    """An environment whose `slow_add` outlives its deadline: it waits for the test's release, then adds."""

    def reset(self, **row) -> None:
        self.value = 0

    def add(self, amount: int) -> str:
        """Adds to the ledger.

        Args:
            amount: How much to add.
        """
        self.value += amount
        return str(self.value)

    def slow_add(self, amount: int) -> str:
        """Adds to the ledger, slowly.

        Args:
            amount: How much to add.
        """
        RELEASE.wait(10)
        self.value += amount
        MUTATED.set()
        return str(self.value)

    def get_reward(self) -> float:
        return float(self.value)


@pytest.mark.parametrize("workers", [1, 2], ids=["main_thread", "worker_threads"])
def test_an_environment_whose_method_timed_out_is_discarded_never_reset_and_reused(workers):
    tok = chatml_tokenizer(["slow", "fast", "add", "slow_add", "amount", "discarded"])
    script = {
        "slow": [tool_call("slow_add", amount=5), tool_call("add", amount=1), "done"],
        "fast": [tool_call("add", amount=2), "done"],
    }
    RELEASE.clear(), MUTATED.clear()
    engine = ScriptedTurns(tok, script)
    multi = rollouts(tok, environment=Ledger, workers=workers)
    try:
        first = multi.generate(engine, [{"prompt": "slow"}, {"prompt": "fast"}], sampling(1))
        slow, fast = first.completions
        assert tool_results(slow)[0].startswith(f"error: slow_add: timed out after {TIMEOUT:g} s; the environment was")
        assert "discarded" in tool_results(slow)[1] and slow.episode.environment.value == 0  # add(1) never ran
        assert slow.episode.failures == {"slow_add": 1, "add": 1}
        # It never gains by timing out: the lowest reward of the others, not its own state.
        assert (slow.episode.environment_reward, fast.episode.environment_reward) == (2.0, 2.0)

        def release_the_late_call():  # after the second step's resets, before its rewards
            if engine.before_generate is not None:
                engine.before_generate = None
                RELEASE.set()
                MUTATED.wait(2 if workers > 1 else 0.2)  # the worker thread's call lands now; the main thread's stopped

        engine.before_generate = release_the_late_call
        second = multi.generate(engine, [{"prompt": "fast"}], sampling(2))
        pool = list(multi.environments._pool[None])
    finally:
        RELEASE.set()
        multi.close()
    discarded = slow.episode.environment
    assert all(c.episode.environment is not discarded for c in second.completions)
    assert all(x is not discarded for x in pool) and len(pool) == 2  # a fresh instance took its place
    assert [c.episode.environment_reward for c in second.completions] == [2.0, 2.0]


def echo(word: str) -> str:
    """Says the word back.

    Args:
        word: The word.
    """
    return word


class _StopsAfterTheCall(ScriptedTurns):
    """Ends a tool-call turn on the call's last token, as a rollout.stop on "</tool_call>" does: no end-of-turn
    token sampled."""

    def _turn(self, context):
        turn = super()._turn(context)
        if "</tool_call>" not in self.tokenizer.decode(turn.token_ids):
            return turn
        return Completion(turn.token_ids[:-1], turn.logprobs[:-1], turn.text)


def test_a_turn_stopped_before_its_end_of_turn_token_is_closed_as_the_template_closes_it():
    """The trained sequence had '</tool_call>' followed by the tool block: a context the template never renders."""
    tok = chatml_tokenizer(["s", "echo", "word", "hi"])
    multi = rollouts(tok, [echo])
    script = {"s": [tool_call("echo", word="hi"), "done"]}
    try:
        (c,) = multi.generate(_StopsAfterTheCall(tok, script), [{"prompt": "s"}], sampling(1)).completions
    finally:
        multi.close()
    assert tool_results(c) == ["hi"]
    first_inserted = c.sampled.index(False)
    assert c.token_ids[first_inserted] == tok.eos_token_id  # <|im_end|>, inserted: out of the loss
    assert "</tool_call><|im_end|>" in tok.decode(c.token_ids)


def test_a_turn_cut_off_inside_its_tool_call_is_scored_on_its_text():
    """A truncated turn whose call cannot be parsed kept no text at all for the reward ('')."""
    tok = chatml_tokenizer(["s", "echo", "word", "hi", "The answer is 42"])
    multi = multi_turn(tok, [echo], max_iterations=2, max_completion_length=14, max_model_len=2048, timeout=TIMEOUT)
    script = {"s": ["The answer is 42 " + tool_call("echo", word="hi")]}
    try:
        (c,) = multi.generate(ScriptedTurns(tok, script), [{"prompt": "s"}], sampling(1)).completions
    finally:
        multi.close()
    assert c.finish_reason == "length" and c.episode.calls == 0
    assert c.episode.answer.startswith("The answer is 42")

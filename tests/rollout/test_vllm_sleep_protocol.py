"""The order of vLLM calls around sleep mode, which only a GPU can run: checked here against a recording
stand-in for `vllm.LLM` (the engine's own code runs unchanged; only the LLM object is replaced).

A step on a GPU: sleep(level) -> [training] -> wake_up(["weights"]) -> reload_weights(every tensor) ->
reset_prefix_cache() -> wake_up(["kv_cache"]) -> generate. Level 2 discards the weights, so only a
reload may wake them; a failed reload must leave the engine's record of what sleeps true and refuse to
generate from half-synced weights."""

from __future__ import annotations

import pytest
import torch

from grpo_fast.rollout.base import SamplingSpec
from grpo_fast.rollout.vllm_engine import VLLMEngine


class RecordingLLM:
    def __init__(self, fail_reload: bool = False, reset_ok: bool = True) -> None:
        self.calls: list[tuple] = []
        self.fail_reload, self.reset_ok = fail_reload, reset_ok

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags or ())))

    def collective_rpc(self, method, kwargs):
        names = [name for name, _ in kwargs["weights_iterator"]]
        self.calls.append((method, tuple(names)))
        if self.fail_reload:
            raise RuntimeError("reload failed")

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))
        return self.reset_ok

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(("generate", len(prompts)))
        return []


WEIGHTS = [(f"layer{i}.weight", torch.ones(4, 4)) for i in range(5)]


def _engine(level: int, llm: RecordingLLM) -> VLLMEngine:
    engine = object.__new__(VLLMEngine)  # everything but vllm.LLM itself, which needs a GPU for sleep mode
    engine.llm, engine._vllm = llm, None
    engine.on_gpu, engine.sleep_supported, engine.sleep_level = False, True, level
    engine.model_dtype, engine.sync_bucket_bytes = torch.float32, 1 << 20
    engine.asleep, engine.weights_stale, engine.num_syncs = set(), False, 0
    return engine


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_sync_generate_call_order(level):
    llm = RecordingLLM()
    engine = _engine(level, llm)
    engine.sleep()
    engine.sleep()  # idempotent
    engine.load_weights(iter(WEIGHTS))
    engine.generate([], SamplingSpec())
    names = tuple(name for name, _ in WEIGHTS)
    assert llm.calls == [
        ("sleep", level),
        ("wake_up", ("weights",)),
        ("reload_weights", names),  # every tensor, which level 2 needs (its weights were discarded)
        ("reset_prefix_cache",),
        ("wake_up", ("kv_cache",)),
        ("generate", 0),
    ]
    assert engine.asleep == set() and engine.num_syncs == 1


def test_level_two_cannot_wake_without_weights():
    engine = _engine(2, RecordingLLM())
    engine.sleep()
    with pytest.raises(RuntimeError, match="level-2 sleep discarded the weights"):
        engine.generate([], SamplingSpec())


def test_a_failed_reload_keeps_the_record_true_and_blocks_generation():
    llm = RecordingLLM(fail_reload=True)
    engine = _engine(1, llm)
    engine.sleep()
    with pytest.raises(RuntimeError, match="reload failed"):
        engine.load_weights(iter(WEIGHTS))
    assert engine.asleep == {"kv_cache"}  # the weights were woken, the KV cache was not
    with pytest.raises(RuntimeError, match="last weight sync failed"):
        engine.generate([], SamplingSpec())
    llm.fail_reload = False
    llm.calls.clear()
    engine.load_weights(iter(WEIGHTS))  # the retry does not wake the weights a second time
    assert [c[0] for c in llm.calls] == ["reload_weights", "reset_prefix_cache", "wake_up"]
    assert llm.calls[-1] == ("wake_up", ("kv_cache",))
    engine.generate([], SamplingSpec())


def test_a_prefix_cache_that_cannot_be_reset_fails_the_sync():
    engine = _engine(1, RecordingLLM(reset_ok=False))
    with pytest.raises(RuntimeError, match="could not reset its prefix cache"):
        engine.load_weights(iter(WEIGHTS))
    with pytest.raises(RuntimeError, match="last weight sync failed"):
        engine.generate([], SamplingSpec())

"""The order of vLLM calls around sleep mode, which only a GPU can run: checked here against a recording
stand-in for `vllm.LLM` (the engine's own code runs unchanged; only the LLM object is replaced).

A step on a GPU: sleep(level) -> [training] -> wake_up(["weights"]) -> reload_weights(every tensor) ->
reset_prefix_cache() -> wake_up(["kv_cache"]) -> generate. Level 2 discards the weights, so only a
reload may wake them; a failed reload must leave the engine's record of what sleeps true and refuse to
generate from half-synced weights.

Level 2 is what training runs use (the trainer re-pushes every weight before it generates again): a whole
run at level 2 (preflight, pass-rate curriculum, steps, held-out evaluation, then the sampler on the same
engine) goes through a scripted stand-in whose generate answers like vLLM's, and no generation may meet
discarded weights."""

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
    engine._decoder = None  # RecordingLLM returns no completions to decode
    engine._group, engine._group_rank = None, 0  # an engine of its own (no tensor-parallel ranks)
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
    llm = RecordingLLM()
    engine = _engine(2, llm)
    engine.sleep()
    with pytest.raises(RuntimeError, match="level-2 sleep discarded the weights"):
        engine.generate([], SamplingSpec())
    with pytest.raises(RuntimeError, match="level-2 sleep discarded the weights"):
        engine.wake_up()
    assert ("wake_up", ("weights",)) not in llm.calls  # nothing was woken: the weights would be garbage
    assert engine.asleep == {"weights", "kv_cache"}
    engine.load_weights(iter(WEIGHTS))  # the one way back
    engine.generate([], SamplingSpec())
    engine.sleep()  # and the guard holds again after the next sleep
    with pytest.raises(RuntimeError, match="level-2 sleep discarded the weights"):
        engine.generate([], SamplingSpec())


def test_level_one_wakes_without_a_sync():
    """Level 1 kept the weights in host memory: generating right after a sleep wakes them, then the cache."""
    llm = RecordingLLM()
    engine = _engine(1, llm)
    engine.sleep()
    engine.generate([], SamplingSpec())
    assert llm.calls == [("sleep", 1), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",)), ("generate", 0)]


class ScriptedLLM(RecordingLLM):
    """Answers `generate` like vLLM (per request: n outputs with index, token ids, flat or per-position
    logprobs, finish reason; no text, as with detokenize=False): a digit then EOS, seeded by the request."""

    def __init__(self, digits: list[int], eos: int) -> None:
        super().__init__()
        self.digits, self.eos = digits, eos

    def generate(self, prompts, params, use_tqdm=False):
        import random
        from types import SimpleNamespace as NS

        self.calls.append(("generate", len(prompts)))
        outs = []
        for p in params:
            rng = random.Random(p.seed)
            group = []
            for j in range(p.n):
                ids = [rng.choice(self.digits), self.eos]
                lps = [{t: NS(logprob=-0.5)} for t in ids]
                group.append(NS(index=j, token_ids=ids, logprobs=lps, text="", finish_reason="stop"))
            outs.append(NS(outputs=group))
        return outs


def test_a_whole_run_at_level_two_never_generates_from_discarded_weights(tmp_path):
    from types import SimpleNamespace

    from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
    from grpo_fast.curate.sampling import run_sampling
    from grpo_fast.data.tasks import modular_arithmetic_dataset
    from grpo_fast.trainer import GRPOTrainer
    from grpo_fast.trainer.config import load_sample_config

    tok = build_char_tokenizer()
    llm = ScriptedLLM([tok.convert_tokens_to_ids(str(d)) for d in range(10)], tok.eos_token_id)
    engine = _engine(2, llm)
    engine._vllm = SimpleNamespace(SamplingParams=lambda **kw: SimpleNamespace(**kw))
    engine._decoder = tok._tokenizer  # texts batch-decoded as with the real engine
    cfg = load_sample_config(  # a training config with the `sample` section
        None,
        [
            "rollout.engine=vllm",
            "rollout.vllm.sleep_level=2",
            "rollout.num_generations=2",
            "rollout.max_completion_length=2",
            "run.prompts_per_step=2",
            "run.max_steps=3",
            "run.eval_every=1",  # held-out evaluation after every step
            "curriculum.every=2",  # pass rates measured before step 0 and at step 2
            "curriculum.samples=2",
            "check.difficulty_prompts=2",
            "check.difficulty_samples=2",
            "reward.workers=0",
            "run.save_final=false",
            "run.plots=false",
            "run.tensorboard=false",
            "run.progress=false",
            f"run.output_dir={tmp_path / 'run'}",
            f"sample.output_dir={tmp_path / 'sample'}",
            "sample.samples_per_prompt=2",
        ],
    )
    rows = modular_arithmetic_dataset(8, seed=0)
    model = build_tiny_model(tok)
    trainer = GRPOTrainer(model, ["exact_match"], rows, config=cfg, eval_dataset=rows[:4], tokenizer=tok, engine=engine)
    try:
        trainer.preflight()
        trainer.train()
        trainer.evaluate()
        run_sampling(cfg, rows[:4], tokenizer=tok, model=model, engine=engine)
    finally:
        trainer.close()
    kinds = [c[0] for c in llm.calls]
    assert kinds.count("sleep") == 3 and ("sleep", 2) in llm.calls  # one per step, at level 2
    for i, kind in enumerate(kinds):  # after every sleep, a full reload before any generation
        if kind == "sleep":
            rest = kinds[i + 1 :]
            assert "reload_weights" in rest
            assert "generate" not in rest[: rest.index("reload_weights")]
    assert kinds.count("generate") >= 3 + 4 + 2  # steps, evaluations, curriculum passes (and more)
    assert engine.asleep == set() and not engine.weights_stale


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

"""The rollout contract's matrix (grpo_fast.rollout.contract): every scheduler (rollout.mode sync, partial, async) x
every rollout kind (single turn, multi-turn with tools and an environment, a user's rollout_func) x every engine
(transformers, vLLM, a registered plug-in) either trains through GRPOTrainer or is refused before the run with a
message naming the piece that cannot do its part.

Tiny sizes: one step of two prompts x two completions. Single-turn cells use a byte-level BPE tokenizer (partial and
async join rounds); multi-turn cells the BPE tool agent (tool_agent.py), so that their rollouts really call tools
in the trainer's rounds and in the engine process. The vLLM cells of single-turn rollouts share the session's vLLM
engine (its char-level tiny model); the cells that start a vLLM of their own are slow, each piece they combine being
covered by a cheap cell (vLLM by the single-turn cells, the engine process and multi-turn by the hf and plug-in
cells).
"""

from __future__ import annotations

import os

import pytest
from plugin_engine import MatrixPluginEngine  # noqa: F401 - registers "matrix_plugin"
from tool_agent import TOOLS, CounterEnv
from transformers import AutoModelForCausalLM

from grpo_fast.core.tiny_models import build_byte_bpe_tokenizer, build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rewards.text import completion_text
from grpo_fast.trainer import GRPOTrainer, load_config

SCHEDULERS = ("sync", "partial", "async")
KINDS = ("single_turn", "multi_turn", "rollout_func")
ENGINES = ("hf", "vllm", "matrix_plugin")
REFUSED = {("partial", "rollout_func"): "a rollout_func cannot be continued over rounds",
           ("async", "rollout_func"): "a rollout_func cannot be continued over rounds"}  # fmt: skip
SLOW = {("sync", "multi_turn", "vllm"), ("partial", "multi_turn", "vllm"), ("async", "multi_turn", "vllm")}
SLOW |= {("async", "single_turn", "vllm"), ("async", "rollout_func", "vllm")}
G, PROMPTS = 2, 2


def length_reward(prompts, completions, **_):
    """Varies within a group, so every step has a gradient."""
    return [len(completion_text(c)) % 5 / 4 for c in completions]


def _rollout_func(prompts, trainer):
    """TRL's rollout_func: one engine call of the trainer's own engine, the completions as ids."""
    ids = [trainer.prompts.encode(p) for p in prompts]
    spec = trainer.config.rollout
    from grpo_fast.rollout.prompts import training_sampling

    outs = trainer.engine.generate(ids, training_sampling(spec, trainer.stop_ids, 1, 0))
    return {
        "prompt_ids": ids,
        "completion_ids": [o[0].token_ids for o in outs],
        "logprobs": [o[0].logprobs for o in outs],
    }


def _cells():
    """Every cell; those that build an in-process vLLM engine of their own last: closing one tears down vLLM's
    process-wide parallel state, which the session's shared engine (the other vllm cells) still needs."""
    cells = [(s, k, e) for s in SCHEDULERS for k in KINDS for e in ENGINES]
    cells.sort(key=lambda cell: cell[1] == "multi_turn" and cell[2] == "vllm")
    return [
        pytest.param(s, k, e, marks=[pytest.mark.slow] if (s, k, e) in SLOW else [], id=f"{s}-{k}-{e}")
        for s, k, e in cells
    ]


def _setup(kind: str, engine: str, request, tmp_path):
    """(model, tokenizer, rows, trainer keyword arguments, engine object to reuse or None, extra overrides)."""
    if kind == "multi_turn":
        _, tok, path = request.getfixturevalue("bpe_tool_agent")
        rows = [{"prompt": p} for p in ("m", "c", "a", "t")]
        extra = ["rollout.max_completion_length=96", "rollout.max_model_len=256", "rollout.tool_timeout_seconds=1"]
        extra += ["rollout.max_tool_calling_iterations=2", "rollout.temperature=0.7"]
        kwargs = {"tools": list(TOOLS), "environment_factory": CounterEnv}
        return AutoModelForCausalLM.from_pretrained(path), tok, rows, kwargs, None, extra
    rows = modular_arithmetic_dataset(16, seed=0)
    extra = ["rollout.max_completion_length=8", "rollout.max_model_len=64"]
    kwargs = {"rollout_func": _rollout_func} if kind == "rollout_func" else {}
    if engine == "vllm" and kind != "multi_turn":  # the session's engine: its char-level tiny model
        tok = build_char_tokenizer()
        shared = request.getfixturevalue("vllm_engine")
        return build_tiny_model(tok, seed=0), tok, rows, kwargs, shared, extra
    tok = build_byte_bpe_tokenizer()
    return build_tiny_model(tok, seed=0), tok, rows, kwargs, None, extra


@pytest.mark.parametrize(("scheduler", "kind", "engine"), _cells())
def test_every_cell_trains_or_is_refused_by_name(scheduler, kind, engine, request, tmp_path):
    refused = (scheduler, kind) in REFUSED
    model, tok, rows, kwargs, shared, extra = _setup(kind, "hf" if refused else engine, request, tmp_path)
    overrides = [f"rollout.mode={scheduler}", f"rollout.engine={engine}", f"rollout.num_generations={G}"]
    overrides += ["rollout.partial.segment_tokens=4", "rollout.max_staleness=2", "rollout.async_engine.threads=1"]
    overrides += ["rollout.async_engine.timeout_seconds=300", "rollout.vllm.dtype=float32"]
    overrides += [f"rollout.vllm.kv_cache_memory_bytes={64 << 20}", f"run.prompts_per_step={PROMPTS}"]
    overrides += ["run.max_steps=1", "run.eval_every=0", "run.save_final=false", "reward.workers=0"]
    overrides += ["run.report_to=[]", "run.progress=false", "run.plots=false", "health.preflight=false"]
    overrides += [f"run.output_dir={tmp_path / 'run'}", *extra]
    config = load_config(None, overrides)
    record = tmp_path / "built"
    record.mkdir()
    config.rollout.plugins = {"matrix_plugin": {"record_dir": str(record)}} if engine == "matrix_plugin" else {}
    if refused:
        with pytest.raises(ValueError, match=f"rollout.mode {scheduler}: {REFUSED[scheduler, kind]}"):
            GRPOTrainer(model, [length_reward], rows, config=config, tokenizer=tok, engine=shared, **kwargs)
        return
    trainer = GRPOTrainer(model, [length_reward], rows, config=config, tokenizer=tok, engine=shared, **kwargs)
    try:
        trainer.train()
        metrics = trainer.metrics.history[-1]
    finally:
        trainer.close()
    assert trainer.step == 1 and metrics["rollout/trained_samples"] == PROMPTS * G
    assert metrics["rollout/staleness_max"] <= 2 and metrics["loss"] == metrics["loss"]  # finite
    if kind == "multi_turn":  # the agent's rollouts called tools, in whichever process generated them
        assert metrics["tools/calls_per_rollout"] > 0
    if engine == "matrix_plugin" and kind != "rollout_func":
        builders = {int(p.name) for p in record.iterdir()}
        assert (os.getpid() in builders) == (scheduler != "async")  # async: the eval engine is the trainer's hf
        if scheduler == "async":
            assert builders, "the engine process did not build the plug-in engine"


def test_a_rollout_func_named_in_the_config_is_refused_with_rounds():
    with pytest.raises(ValueError, match="rollout.mode partial: a rollout_func cannot be continued over rounds"):
        load_config(None, ["rollout.mode=partial", f"rollout.rollout_func={__name__}:_rollout_func"])


def test_an_engine_that_cannot_leave_the_trainer_is_refused_for_async():
    class Pinned(MatrixPluginEngine):
        runs_in_engine_process = False

    from grpo_fast.rollout.contract import SCHEDULERS, check_plan, engine_capabilities
    from grpo_fast.rollout.generation import SingleTurn

    with pytest.raises(ValueError, match="rollout.mode async: rollout.engine 'pinned' cannot be built in an engine"):
        check_plan(SCHEDULERS["async"], SingleTurn.capabilities, engine_capabilities("pinned", Pinned))
    check_plan(SCHEDULERS["partial"], SingleTurn.capabilities, engine_capabilities("pinned", Pinned))


def test_multi_turn_tools_that_an_engine_process_cannot_import_are_named(bpe_tool_agent, tmp_path):
    """A tool defined inside a function cannot be rebuilt in the engine process: async refuses it by name."""

    def local_tool(x: int) -> int:
        """Returns x.

        Args:
            x: A number.
        """
        return x

    _, tok, path = bpe_tool_agent
    config = load_config(None, ["rollout.mode=async", "rollout.max_model_len=256", f"run.output_dir={tmp_path}"])
    with pytest.raises(ValueError, match="multi-turn rollouts .* cannot run in the engine process .*local_tool"):
        GRPOTrainer(path, [length_reward], [{"prompt": "m"}], config=config, tokenizer=tok, tools=[local_tool])

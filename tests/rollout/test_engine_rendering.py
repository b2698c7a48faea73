"""The engine process of asynchronous multi-turn rollouts renders every prompt to the trainer's ids: it loads the
tokenizer as the trainer does (its saved class), renders with the trainer's chat template and chat_template_kwargs
(carried in the rollout kind's recipe), and refuses to start when a probe conversation still renders otherwise.

Found on the tools task: the engine process loaded the demo's character tokenizer (saved under a Qwen2 model) as
transformers' byte-level Qwen2Tokenizer, which drops spaces, so every async rollout started from a prompt the policy
was never trained on ("tools:multiply(a,b)" for "tools: multiply(a,b)") and one seed in three never learned."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from scripted_chat import QWEN3_SPECIAL, build_bpe_chat_tokenizer, qwen3_template
from transformers import AutoTokenizer

from grpo_fast.core.tiny_models import build_chat_tokenizer, build_tiny_model, save_tiny
from grpo_fast.data.tokenizer import load_tokenizer
from grpo_fast.rollout.async_rollouts import EngineSpec, build_engine
from grpo_fast.rollout.prompts import PromptEncoder, stop_token_ids
from grpo_fast.rollout.rollouts import build_rollouts, rollouts_from_recipe
from grpo_fast.trainer import load_config

ROW = {"prompt": "1234*5678="}


def _trainer_kind(tokenizer, overrides: list[str]):
    """The trainer's multi-turn rollout kind with the built-in `multiply` tool, and its config."""
    config = load_config(None, ["rollout.tools=[multiply]", *overrides])
    prompts = PromptEncoder(tokenizer, config.data)
    return build_rollouts(config.rollout, prompts, tokenizer, stop_token_ids(tokenizer, [])), config


def _prompt_ids(kind, row=ROW) -> list[int]:
    return kind.begin(0, row, None, 1)[0].prompt_ids


def test_engine_process_renders_the_demo_prompts_as_the_trainer(tmp_path):
    """The demo's character tokenizer under a Qwen2 model: the engine process's tokenizer (build_engine) and rollout
    kind (rollouts_from_recipe) give the trainer's prompt ids, spaces included."""
    model_dir = save_tiny(build_tiny_model(build_chat_tokenizer()), build_chat_tokenizer(), tmp_path / "model")
    trainer_tokenizer = load_tokenizer(str(model_dir))
    kind, config = _trainer_kind(trainer_tokenizer, ["rollout.engine=hf"])
    spec = EngineSpec(
        "hf", str(model_dir), {}, {"rollout": dataclasses.asdict(config.rollout), "run": {"seed": 0}}, kind.recipe()
    )
    engine, _, engine_tokenizer = build_engine(spec)
    engine_kind = rollouts_from_recipe(spec.rollouts, engine_tokenizer)
    try:
        expected = _prompt_ids(kind)
        assert trainer_tokenizer.decode(expected).startswith("<|system|>tools: multiply(a,b)")
        assert _prompt_ids(engine_kind) == expected
    finally:
        engine_kind.close()
        engine.close()
        kind.close()


def test_engine_process_refuses_a_tokenizer_that_renders_otherwise(tmp_path):
    """A tokenizer that drops the spaces (AutoTokenizer's class for that directory) is refused by name before any
    rollout starts, instead of generating from other prompts."""
    model_dir = save_tiny(build_tiny_model(build_chat_tokenizer()), build_chat_tokenizer(), tmp_path / "model")
    kind, _ = _trainer_kind(load_tokenizer(str(model_dir)), [])
    other = AutoTokenizer.from_pretrained(model_dir)
    assert type(other).__name__ == "Qwen2Tokenizer"  # the premise: transformers picks the model type's class
    with pytest.raises(RuntimeError, match="renders prompts to other ids than the trainer's"):
        rollouts_from_recipe(kind.recipe(), other)
    kind.close()


def test_engine_process_renders_with_the_trainers_template_and_kwargs():
    """Qwen3's template with enable_thinking false: the trainer renders with TRL's training template and the run's
    chat_template_kwargs; an engine process holding the tokenizer as loaded (neither) renders the same ids."""
    tokenizer = build_bpe_chat_tokenizer(["1234*5678=", "answer", "multiply"], special=QWEN3_SPECIAL)
    tokenizer.chat_template = qwen3_template()
    as_loaded = copy.deepcopy(tokenizer)  # before the trainer's preparation (TRL's response schema)
    kind, _ = _trainer_kind(tokenizer, ["data.chat_template_kwargs={enable_thinking: false}"])
    engine_kind = rollouts_from_recipe(kind.recipe(), as_loaded)
    expected = _prompt_ids(kind)
    assert tokenizer.decode(expected).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert _prompt_ids(engine_kind) == expected
    engine_kind.close()
    kind.close()

"""Rollout engines by name: a plug-in engine registered (or named by its import path) is built and
driven by the trainer without any change to the trainer; unknown names fail where they are named."""

from __future__ import annotations

import pytest

from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.demo.tiny import build_char_tokenizer, build_tiny_model
from grpo_fast.rollout import ROLLOUT_ENGINES, RolloutEngine, create_engine
from grpo_fast.rollout.hf_engine import HFEngine
from grpo_fast.rollout.registry import resolve_engine_name
from grpo_fast.trainer import GRPOTrainer, load_config


class CountingEngine(HFEngine):
    """A plug-in engine: transformers generation that counts its calls and reads its own option from
    the run config (the trainer does not know it)."""

    name = "counting"
    built: list[CountingEngine] = []

    def __init__(self, model, tokenizer, seed: int) -> None:
        super().__init__(model, tokenizer)
        self.seed, self.generate_calls, self.syncs = seed, 0, 0
        CountingEngine.built.append(self)

    @classmethod
    def from_config(cls, config, *, model, tokenizer, export_model):
        return cls(model, tokenizer, seed=config.run.seed)

    def generate(self, prompt_token_ids, sampling):
        self.generate_calls += 1
        return super().generate(prompt_token_ids, sampling)

    def load_weights(self, weights):
        self.syncs += 1
        return super().load_weights(weights)


ROLLOUT_ENGINES.register("counting", CountingEngine)


def _config(tmp_path, engine: str):
    return load_config(
        None,
        [
            f"rollout.engine={engine}",
            "rollout.num_generations=2",
            "rollout.max_completion_length=2",
            "run.prompts_per_step=2",
            "run.max_steps=2",
            "run.seed=5",
            "run.eval_every=0",
            "run.save_final=false",
            "run.plots=false",
            "run.tensorboard=false",
            "run.progress=false",
            f"run.output_dir={tmp_path}",
        ],
    )


@pytest.mark.parametrize("name", ["counting", f"{__name__}:CountingEngine"])
def test_trainer_builds_and_drives_a_plug_in_engine(tmp_path, name):
    CountingEngine.built.clear()
    tok = build_char_tokenizer()
    rows = modular_arithmetic_dataset(8, seed=0)
    trainer = GRPOTrainer(build_tiny_model(tok), ["exact_match"], rows, config=_config(tmp_path, name), tokenizer=tok)
    trainer.train()
    (engine,) = CountingEngine.built
    assert trainer.engine is engine and engine.seed == 5
    assert engine.generate_calls == 2 * 2  # 2 steps x 2 overlap chunks
    assert engine.syncs == 3  # at the start and after each step


def test_auto_picks_the_first_available_engine():
    vllm = ROLLOUT_ENGINES.get("vllm")
    assert resolve_engine_name("auto") == ("vllm" if vllm.available() else "hf")
    assert resolve_engine_name("hf") == "hf"


def test_unknown_or_wrong_engines_are_errors(tmp_path):
    with pytest.raises(ValueError, match="rollout.engine: expected 'auto', one of"):
        _config(tmp_path, "nope")
    with pytest.raises(ValueError, match="rollout engine: unknown name 'nope'"):
        create_engine("nope", None, model=None, tokenizer=None, export_model=str)
    with pytest.raises(ValueError, match="expected a RolloutEngine subclass"):
        create_engine("builtins:dict", None, model=None, tokenizer=None, export_model=str)
    with pytest.raises(ValueError, match="already registered"):
        ROLLOUT_ENGINES.register("hf", CountingEngine)
    assert issubclass(CountingEngine, RolloutEngine)

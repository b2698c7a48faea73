"""Rollout engines by name: a plug-in engine registered (or named by its import path) is built and
driven by the trainer without any change to the trainer; unknown names fail where they are named. "auto"
sizes the policy: transformers for small models on CPU, vLLM on a GPU and for larger models; the engine
records the choice and the reason, which is logged."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from grpo_fast.config_fields import ConfigSection, option
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rollout import ROLLOUT_ENGINES, RolloutEngine, create_engine, registry
from grpo_fast.rollout.hf_engine import HFEngine
from grpo_fast.rollout.registry import EngineSelection, choose_engine, resolve_engine_name
from grpo_fast.trainer import GRPOTrainer, load_config


@dataclasses.dataclass
class CountingOptions(ConfigSection):
    """A plug-in engine's own options section (`rollout.plugins.counting`)."""

    key = "rollout.plugins.counting"
    seed_offset: int = option(0, "added to the run's seed", low=0)


class CountingEngine(HFEngine):
    """A plug-in engine: transformers generation that counts its calls and reads its own options from
    the run config (the trainer does not know them)."""

    name = "counting"
    options = CountingOptions
    built: list[CountingEngine] = []

    def __init__(self, model, tokenizer, seed: int) -> None:
        super().__init__(model, tokenizer)
        self.seed, self.generate_calls, self.syncs = seed, 0, 0
        CountingEngine.built.append(self)

    @classmethod
    def from_config(cls, config, *, options, model, tokenizer, export_model):
        return cls(model, tokenizer, seed=config.run.seed + options.seed_offset)

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
    assert engine.generate_calls == 1 + 2  # the launch checklist's difficulty probe, then one call a step
    assert engine.syncs == 3  # at the start and after each step


def test_auto_without_a_model_picks_the_first_available_engine():
    vllm = ROLLOUT_ENGINES.get("vllm")
    assert resolve_engine_name("auto") == ("vllm" if vllm.available() else "hf")
    assert resolve_engine_name("hf") == "hf"
    assert resolve_engine_name("counting", build_tiny_model(build_char_tokenizer())) == "counting"


@pytest.fixture
def vllm_installed(monkeypatch):
    """ "auto" as on a machine with vLLM (its `available()` only; nothing is started) and without a GPU."""
    monkeypatch.setattr(ROLLOUT_ENGINES.get("vllm"), "available", classmethod(lambda cls: True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_sizes_the_model_on_cpu(vllm_installed, monkeypatch):
    tiny = build_tiny_model(build_char_tokenizer())  # the demo's shape: 0.3M parameters
    params = sum(p.numel() for p in tiny.parameters())
    choice = choose_engine("auto", tiny)
    assert choice.name == "hf" and choice.requested == "auto"
    assert f"{params / 1e6:.2f}M parameters on CPU" in choice.reason and "rollout.engine=vllm" in choice.reason
    monkeypatch.setattr(registry, "AUTO_HF_MAX_PARAMS_CPU", params)  # a model at the threshold: vLLM
    assert choose_engine("auto", tiny).name == "vllm"
    assert choose_engine("vllm", tiny) == EngineSelection("vllm", "vllm", "named in rollout.engine")
    assert choose_engine("auto", None).name == "vllm"  # nothing to size: the sampler's engine loads its own


def test_auto_picks_vllm_on_a_gpu_and_hf_without_vllm(vllm_installed, monkeypatch):
    tiny = build_tiny_model(build_char_tokenizer())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    choice = choose_engine("auto", tiny)
    assert choice.name == "vllm" and "accelerator" in choice.reason
    monkeypatch.setattr(ROLLOUT_ENGINES.get("vllm"), "available", classmethod(lambda cls: False))
    assert choose_engine("auto", tiny) == EngineSelection("auto", "hf", "vLLM is not installed")
    assert choose_engine("auto", None).name == "hf"


def test_create_engine_records_and_logs_what_auto_picked(vllm_installed, caplog, tmp_path):
    tok = build_char_tokenizer()
    model = build_tiny_model(tok)
    with caplog.at_level(logging.INFO, logger="grpo_fast.rollout.registry"):
        engine = create_engine("auto", _config(tmp_path, "auto"), model=model, tokenizer=tok, export_model=str)
    assert isinstance(engine, HFEngine) and engine.name == "hf"
    assert engine.selection.requested == "auto" and engine.selection.name == "hf"
    assert f"rollout engine 'auto' -> hf: {engine.selection.reason}" in caplog.text
    plug_in = create_engine("counting", _config(tmp_path, "counting"), model=model, tokenizer=tok, export_model=str)
    assert plug_in.name == "counting" and plug_in.selection.reason == "named in rollout.engine"


def test_trainer_with_auto_on_a_tiny_model_records_the_engine(vllm_installed, tmp_path):
    """The trainer's engine says which one "auto" picked (for the metrics / summary)."""
    tok = build_char_tokenizer()
    rows = modular_arithmetic_dataset(8, seed=0)
    trainer = GRPOTrainer(build_tiny_model(tok), ["exact_match"], rows, config=_config(tmp_path, "auto"), tokenizer=tok)
    try:
        trainer._ensure_engine()
        assert trainer.engine.name == "hf" and trainer.engine.selection.requested == "auto"
    finally:
        trainer.close()


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


def test_a_plug_in_engine_gets_its_own_options_section(tmp_path):
    tok = build_char_tokenizer()
    model = build_tiny_model(tok)
    config = _config(tmp_path, "counting")
    config.rollout.plugins = {"counting": {"seed_offset": 3}}
    engine = create_engine("counting", config, model=model, tokenizer=tok, export_model=str)
    assert engine.seed == 5 + 3
    config.rollout.plugins = {"counting": {"seed_ofset": 3}}
    with pytest.raises(ValueError, match=r"rollout.plugins.counting: unknown key\(s\) \['seed_ofset'\]"):
        create_engine("counting", config, model=model, tokenizer=tok, export_model=str)
    config.rollout.plugins = {"counting": {"seed_offset": -1}}
    with pytest.raises(ValueError, match="rollout.plugins.counting.seed_offset: expected a value >= 0"):
        create_engine("counting", config, model=model, tokenizer=tok, export_model=str)
    config.rollout.plugins = {}
    hf = create_engine("hf", config, model=model, tokenizer=tok, export_model=str)
    assert hf.batch_size == config.rollout.hf.batch_size == 256  # a built-in reads its own section

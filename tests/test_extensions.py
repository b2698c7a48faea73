"""docs/architecture.md's "Extending it" table, done in a temporary package: a loss type from existing pieces, a new
objective, a backend and a rollout engine are each one file, named from a YAML config (through its `imports`, or as
"package.module:attribute" without registering), and trained with; an incomplete one is refused where it registers,
naming what it lacks. The new objective's own test (its formula on materialised fp64 logits against every backend
here) is part of this file, as a user's would be beside their module."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from grpo_fast import GRPOLossConfig, grpo_loss
from grpo_fast.backends import BACKENDS, available_backends
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.loss import LOSS_TYPES, OBJECTIVES
from grpo_fast.rewards.tasks import exact_match_reward
from grpo_fast.rollout import ROLLOUT_ENGINES
from grpo_fast.testing.synthetic import make_loss_batch
from grpo_fast.trainer import GRPOTrainer, load_config

FILES = {
    # A loss type from an existing objective and reduction: one row.
    "loss_type.py": """
        from grpo_fast.loss import LOSS_TYPES, LossType, Reduction

        TOKEN_MEAN_CLIPPED = LossType("token_mean_clipped", "clipped", Reduction.TOKEN_MEAN, "clipped, token mean")
        LOSS_TYPES.register("token_mean_clipped", TOKEN_MEAN_CLIPPED)
    """,
    # A new objective: its definition once, its own option; gradients, reference and every backend follow.
    "objective.py": """
        from dataclasses import dataclass

        import torch

        from grpo_fast.config_fields import option
        from grpo_fast.loss import OBJECTIVES, Objective, ObjectiveOptions, Surrogate


        @dataclass(frozen=True)
        class CappedOptions(ObjectiveOptions):
            cap: float = option(2.0, "the largest weight of a token", low=0, low_open=True)


        def capped_reinforce(x):
            weight = torch.clamp(x.ratio, max=x.options.cap).detach()
            high = (x.ratio > x.options.cap) & (x.advantages > 0)
            return Surrogate(-weight * x.advantages * x.logprobs, torch.zeros_like(high), high)


        CAPPED_REINFORCE = Objective(
            "capped_reinforce", capped_reinforce, "capped-ratio REINFORCE", options=CappedOptions
        )
        OBJECTIVES.register("capped_reinforce", CAPPED_REINFORCE)
    """,
    # A backend: the chunked orchestration with a small workspace, under a name of its own.
    "backend.py": """
        from grpo_fast.backends import register_backend
        from grpo_fast.backends.chunked import ChunkedBackend, TorchEpilogue

        SMALL = register_backend("small", ChunkedBackend("small", TorchEpilogue(temp_bytes=1 << 12), 1 << 14, 1 << 14))
    """,
    # A rollout engine: transformers generation under a name of its own.
    "engine.py": """
        from grpo_fast.rollout import ROLLOUT_ENGINES
        from grpo_fast.rollout.hf_engine import HFEngine


        class CountingEngine(HFEngine):
            name = "counting_hf"
            calls = 0

            def generate(self, prompt_token_ids, sampling):
                CountingEngine.calls += 1
                return super().generate(prompt_token_ids, sampling)


        ROLLOUT_ENGINES.register("counting_hf", CountingEngine)
    """,
}
# The same four, each missing one thing: each is refused where it registers, naming it.
INCOMPLETE = {
    "bad_loss_type.py": (
        """
        from grpo_fast.loss import LOSS_TYPES, LossType

        LOSS_TYPES.register("bad_row", LossType("bad_row", "clipped", "token_mean"))
        """,
        "reduction must be a member of Reduction",
    ),
    "bad_objective.py": (
        """
        from grpo_fast.loss import OBJECTIVES, Objective

        OBJECTIVES.register("no_definition", Objective("no_definition", definition=None))
        """,
        r"objective 'no_definition': missing \['definition'\]",
    ),
    "bad_backend.py": (
        """
        from grpo_fast.backends import Capabilities, register_backend


        class NoBackward:
            name = "no_backward"
            capabilities = Capabilities()

            def availability(self, device):
                return None

            def forward(self, *args, **kwargs): ...

            def deterministic_variant(self):
                return self


        register_backend("no_backward", NoBackward())
        """,
        r"backend 'no_backward': missing \['backward'\]",
    ),
    "bad_engine.py": (
        """
        from grpo_fast.rollout import ROLLOUT_ENGINES, RolloutEngine


        class NoLoadWeights(RolloutEngine):
            @classmethod
            def from_config(cls, config, *, options, model, tokenizer, export_model):
                return cls()

            def generate(self, prompt_token_ids, sampling):
                return []


        ROLLOUT_ENGINES.register("no_load_weights", NoLoadWeights)
        """,
        r"rollout engine 'no_load_weights': missing \['load_weights'\]",
    ),
}
NAMES = {LOSS_TYPES: ["token_mean_clipped", "bad_row"], OBJECTIVES: ["capped_reinforce", "no_definition"]}
NAMES |= {BACKENDS: ["small", "no_backward"], ROLLOUT_ENGINES: ["counting_hf", "no_load_weights"]}


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """The package `my_plugins` on sys.path; its registrations and modules undone afterwards."""
    package = tmp_path / "my_plugins"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in FILES.items():
        (package / name).write_text(textwrap.dedent(text))
    for name, (text, _) in INCOMPLETE.items():
        (package / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for module in [m for m in sys.modules if m.split(".")[0] == "my_plugins"]:
        del sys.modules[module]
    for registry, names in NAMES.items():
        for name in names:
            registry.unregister(name)


def _yaml_config(tmp_path, text: str, *overrides: str):
    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent(text))
    base = ["rollout.num_generations=4", "rollout.max_completion_length=3", "run.prompts_per_step=2"]
    base += ["run.max_steps=2", "run.eval_every=0", "reward.workers=0", "run.report_to=[]", "run.progress=false"]
    base += ["run.plots=false", "run.save_every=0", "rollout.engine=hf"]
    _yaml_config.runs += 1  # a fresh output directory per run
    return load_config(path, [*base, f"run.output_dir={tmp_path / f'out{_yaml_config.runs}'}", *overrides])


_yaml_config.runs = 0


def _train(config) -> list[dict]:
    tok = build_char_tokenizer()
    rows = modular_arithmetic_dataset(8, seed=0)
    trainer = GRPOTrainer(build_tiny_model(tok), [_digits, exact_match_reward], rows, config=config, tokenizer=tok)
    try:
        trainer.train()
    finally:
        trainer.close()
    lines = (Path(config.run.output_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _digits(prompts, completions, **_):
    """Varied rewards from the first step on (the share of digits), so the advantages are not all 0."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def test_a_loss_type_is_one_file_named_from_yaml(plugins):
    config = _yaml_config(plugins, "imports: [my_plugins.loss_type]\nloss: {loss_type: token_mean_clipped}\n")
    assert config.loss.loss_spec.reduction.value == "token_mean"
    by_path = _yaml_config(plugins, "loss: {loss_type: 'my_plugins.loss_type:TOKEN_MEAN_CLIPPED'}\n")
    batch = make_loss_batch(3, 6, 16, 29, dtype=torch.float64, seed=2)
    losses = [
        grpo_loss(batch.hidden, batch.weight, **batch.token_arguments(), config=c)[0]
        for c in (config.loss, by_path.loss, GRPOLossConfig(loss_type="bnpo"))  # bnpo: the same two pieces
    ]
    assert losses[0] == losses[1] == losses[2]
    history = _train(config)
    assert len(history) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in history)


def _reference_capped(batch, cap):
    """The capped objective's formula on materialised fp64 logits, dapo's reduction (the batch's token mean)."""
    hidden = batch.hidden.double().clone().requires_grad_()
    weight = batch.weight.double().clone().requires_grad_()
    logp = torch.log_softmax(hidden @ weight.t(), -1).gather(-1, batch.completion_ids[..., None])[..., 0]
    ratio = torch.exp(logp - batch.old_logprobs.double())
    per_token = -torch.clamp(ratio, max=cap).detach() * batch.advantages.double()[:, None] * logp
    mask = batch.completion_mask.double()
    loss = (per_token * mask).sum() / mask.sum()
    return (loss, *torch.autograd.grad(loss, (hidden, weight)))


@pytest.mark.parametrize("backend", ["torch", "cpu", "triton"])
def test_a_new_objective_is_one_file_and_runs_on_every_backend(plugins, backend, caplog):
    """Its test: the formula against each backend here (fp64 where the backend takes it; triton: fp32, its layer 2
    falling back to PyTorch with the line naming the objective)."""
    if backend not in available_backends(torch.device("cpu")):
        pytest.skip(f"{backend} does not run here")
    yaml = "imports: [my_plugins.objective]\nloss: {objective: capped_reinforce, objective_options: {cap: 1.1}}\n"
    config = _yaml_config(plugins, yaml, f"loss.backend={backend}").loss
    dtype = torch.float32 if backend == "triton" else torch.float64
    batch = make_loss_batch(3, 7, 16, 41, dtype=dtype, seed=5, drift=0.4)
    hidden, weight = batch.hidden.clone().requires_grad_(), batch.weight.clone().requires_grad_()
    with caplog.at_level(logging.INFO, logger="grpo_fast.loss.token_loss"):
        loss, metrics = grpo_loss(hidden, weight, **batch.token_arguments() | {"is_weights": None}, config=config)
    ours = (loss, *torch.autograd.grad(loss, (hidden, weight)))
    tolerance = dict(rtol=1e-9, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-4, atol=2e-6)
    for got, want in zip(ours, _reference_capped(batch, 1.1), strict=True):
        torch.testing.assert_close(got.double(), want, **tolerance)
    assert 0 < float(metrics["clip_ratio/high_mean"]) < 1  # the cap acts on some tokens
    if backend == "triton":
        assert any("'capped_reinforce' has no triton layer-2 kernel" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_a_new_objective_trains_end_to_end_named_by_its_path(plugins, backend):
    if backend not in available_backends(torch.device("cpu")):
        pytest.skip(f"{backend} does not run here")
    yaml = "loss: {objective: 'my_plugins.objective:CAPPED_REINFORCE', objective_options: {cap: 1.5}}\n"
    history = _train(_yaml_config(plugins, yaml, f"loss.backend={backend}"))
    assert len(history) == 2 and all(h["train/nonfinite"] == 0 and h["grad_norm"] > 0 for h in history)


def test_a_backend_is_one_file_named_from_yaml(plugins):
    config = _yaml_config(plugins, "imports: [my_plugins.backend]\nloss: {backend: small}\n")
    by_path = _yaml_config(plugins, "loss: {backend: 'my_plugins.backend:SMALL'}\n")
    batch = make_loss_batch(3, 7, 16, 41, dtype=torch.float64, seed=3)
    results = [
        grpo_loss(batch.hidden, batch.weight, **batch.token_arguments(), config=c.loss)[0] for c in (config, by_path)
    ]
    torch_backend = grpo_loss(batch.hidden, batch.weight, **batch.token_arguments(), config=GRPOLossConfig())[0]
    torch.testing.assert_close(results[0], torch_backend, rtol=1e-12, atol=0)
    assert results[0] == results[1]
    assert len(_train(config)) == 2


def test_an_engine_is_one_file_named_from_yaml(plugins):
    config = _yaml_config(plugins, "imports: [my_plugins.engine]\n", "rollout.engine=counting_hf")
    assert len(_train(config)) == 2
    engine_cls = ROLLOUT_ENGINES.get("counting_hf")
    assert engine_cls.calls >= 2  # the trainer generated with it
    by_path = _yaml_config(plugins, "{}", "rollout.engine=my_plugins.engine:CountingEngine")
    assert len(_train(by_path)) == 2 and engine_cls.calls >= 4


@pytest.mark.parametrize("module", list(INCOMPLETE))
def test_an_incomplete_extension_is_refused_where_it_registers(plugins, module):
    _, message = INCOMPLETE[module]
    with pytest.raises(TypeError, match=message):
        __import__(f"my_plugins.{module.removesuffix('.py')}")
    with pytest.raises(ValueError, match=rf"imports\[0\]: .*{message}"):  # named in a config: a ValueError naming it
        _yaml_config(plugins, f"imports: [my_plugins.{module.removesuffix('.py')}]\n")

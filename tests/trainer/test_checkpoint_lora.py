"""A LoRA (PEFT) policy checkpoints as its adapters and resumes with identical adapter weights and
optimizer state; a resume with other LoRA settings is refused."""

from __future__ import annotations

import pytest
import torch

from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rewards.text import completion_text
from grpo_fast.trainer import GRPOTrainer, load_config

peft = pytest.importorskip("peft")


def char_code_reward(prompts, completions, **_):
    """A deterministic reward that differs between completions, so every step has a gradient."""
    return [sum(map(ord, completion_text(c))) % 7 / 6 for c in completions]


def _trainer(out, *overrides, r=4):
    tok = build_char_tokenizer()
    lora = peft.LoraConfig(r=r, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = peft.get_peft_model(build_tiny_model(tok, seed=0), lora)
    opts = ["rollout.engine=hf", "rollout.num_generations=2", "rollout.max_completion_length=2"]
    opts += ["run.prompts_per_step=2", "run.eval_every=0", "reward.workers=0", "run.tensorboard=false"]
    opts += ["run.progress=false", "run.plots=false", "optim.lr=1e-2", f"run.output_dir={out}", *overrides]
    rows = modular_arithmetic_dataset(8, seed=0)
    return GRPOTrainer(model, [char_code_reward], rows, config=load_config(None, opts), tokenizer=tok)


def _adapters(model):
    return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}


def test_a_lora_run_resumes_with_identical_adapter_weights(tmp_path):
    out = tmp_path / "run"
    first = _trainer(out, "run.max_steps=1")
    first.train()
    first.close()
    trained = _adapters(first.model)
    assert any(not torch.equal(p, torch.zeros_like(p)) for n, p in trained.items() if "lora_B" in n)

    resumed = _trainer(out, "run.max_steps=1", "run.resume=true")
    assert resumed.resume()
    loaded = _adapters(resumed.model)
    assert loaded.keys() == trained.keys()
    for name, value in trained.items():
        assert torch.equal(loaded[name], value), name
    saved_opt, new_opt = first.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert saved_opt.keys() == new_opt.keys()
    for i, state in saved_opt.items():
        for key, value in state.items():
            assert torch.equal(new_opt[i][key], value), (i, key)
    resumed.close()


def test_a_resume_with_other_lora_settings_is_refused(tmp_path):
    out = tmp_path / "run"
    first = _trainer(out, "run.max_steps=1")
    first.train()
    first.close()
    resumed = _trainer(out, "run.max_steps=2", "run.resume=true", r=8)
    with pytest.raises(ValueError, match=r"lora.default.r: saved 4, now 8"):
        resumed.train()
    resumed.close()

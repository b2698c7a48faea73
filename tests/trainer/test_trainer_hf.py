"""GRPOTrainer end to end with the transformers engine: metrics, plots, atomic checkpoints loadable by
`from_pretrained`, `resume` continuing where the run stopped; num_iterations > 1, beta > 0, IS correction."""

from __future__ import annotations

import json

import torch

from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rewards.tasks import exact_match_reward
from grpo_fast.trainer import GRPOTrainer, load_config


def _trainer(out, overrides):
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=0)
    cfg = load_config(
        None,
        [
            "rollout.engine=hf",
            "rollout.num_generations=4",
            "rollout.max_completion_length=3",
            "run.prompts_per_step=4",
            "run.micro_batch_size=8",
            "run.tensorboard=false",
            "run.progress=false",
            "run.eval_every=2",
            "optim.lr=1e-3",
            f"run.output_dir={out}",
            *overrides,
        ],
    )
    rows = modular_arithmetic_dataset(40, seed=0, ops="*", fixed_b=7)
    return GRPOTrainer(model, [exact_match_reward], rows, config=cfg, eval_dataset=rows[:8], tokenizer=tok)


def test_train_checkpoint_resume(tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    t = _trainer(out, ["run.max_steps=2", "run.save_every=1"])
    last = t.train()
    for key in (
        "reward/mean",
        "frac_zero_var_groups",
        "entropy",
        "completion/length_p95",
        "time/generate",
        "time/train",
        "time/sync",
        "clip_ratio/high_mean",
        "tokens_per_second/train",
        "eval/accuracy",
    ):
        assert key in last, key
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts == ["step-000001", "step-000002"]  # no temp dirs left behind
    reloaded = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step-000002")
    for (n, a), (_, b) in zip(t.model.named_parameters(), reloaded.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, msg=n)
    assert (out / "plots" / "training_curves.png").exists()

    t2 = _trainer(out, ["run.max_steps=3", "run.resume=true"])
    t2.train()
    assert t2.step == 3
    assert t2.sampler.state_dict()["position"] == 12  # 3 steps x 4 prompts
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 3 and steps.count(2) == 1


def test_multi_iteration_kl_and_is_correction(tmp_path):
    t = _trainer(
        tmp_path / "run2",
        [
            "run.max_steps=1",
            "grpo.num_iterations=2",
            "loss.beta=0.05",
            "grpo.is_correction=sequence",
            "grpo.dynamic_sampling=true",
            "loss.loss_type=grpo",
            "run.save_final=false",
            "run.plots=false",
        ],
    )
    last = t.train()
    assert "kl" in last and last["kl"] >= 0
    assert "is_weight_mean" in last and last["mismatch/abs_logprob_diff_mean"] < 1e-3


def test_resume_restores_rng_after_the_engine_starts(tmp_path, monkeypatch):
    """Starting vLLM reseeds the global RNGs (vllm set_random_seed): the checkpoint's RNG states must be
    restored after the engine exists, so the resumed step sees exactly the saved states."""
    from grpo_fast.rollout.hf_engine import HFEngine
    from grpo_fast.trainer import trainer as trainer_mod

    out = tmp_path / "run"
    t = _trainer(out, [])
    torch.manual_seed(1234)
    t.save()
    saved = torch.load(out / "checkpoints" / "step-000000" / "trainer_state.pt", weights_only=True)["rng"]["torch"]

    def make_engine(self):
        torch.manual_seed(self.config.run.seed)  # what vllm.LLM(seed=...) does on start
        return HFEngine(self.model, self.tokenizer)

    seen = []

    def step(self):
        seen.append(torch.get_rng_state())
        return {"reward/mean": 0.0}

    monkeypatch.setattr(trainer_mod.GRPOTrainer, "_make_engine", make_engine)
    monkeypatch.setattr(trainer_mod.GRPOTrainer, "training_step", step)
    opts = ["run.max_steps=1", "run.resume=true", "run.eval_every=0", "run.save_final=false", "run.plots=false"]
    _trainer(out, opts).train()
    assert torch.equal(seen[0], saved)


def test_callbacks_see_every_step(tmp_path):
    seen = []
    t = _trainer(tmp_path / "run", ["run.max_steps=2", "run.eval_every=0", "run.save_final=false", "run.plots=false"])
    t.callbacks.append(lambda trainer, rollout, metrics: seen.append((trainer.step, len(rollout.completions), metrics)))
    t.train()
    assert [(step, n) for step, n, _ in seen] == [(0, 16), (1, 16)]  # before the step counter moves on
    assert all("reward/mean" in metrics for _, _, metrics in seen)

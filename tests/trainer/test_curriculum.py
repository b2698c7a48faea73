"""The online pass-rate curriculum: after each measurement the trainer draws prompts only from the band,
the counts are in the metrics, and a resumed run keeps the measured pass rates."""

from __future__ import annotations

from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rewards.text import completion_text
from grpo_fast.trainer import GRPOTrainer, load_config
from grpo_fast.trainer.data_sampler import PromptSampler

ROWS = modular_arithmetic_dataset(12, seed=0)


def first_char_reward(prompts, completions, answer, **_):
    """1 when the completion's first character is the answer's (a prompt-dependent pass rate)."""
    return [float(completion_text(c)[:1] == a[:1]) for c, a in zip(completions, answer, strict=True)]


def _trainer(out, *extra):
    tok = build_char_tokenizer()
    cfg = load_config(
        None,
        [
            "rollout.engine=hf",
            "rollout.num_generations=4",
            "rollout.max_completion_length=2",
            "run.prompts_per_step=3",
            "run.micro_batch_size=16",
            "run.tensorboard=false",
            "run.progress=false",
            "run.plots=false",
            "run.eval_every=0",
            "reward.workers=0",
            "curriculum.every=2",
            "curriculum.samples=16",
            "curriculum.low=0.05",
            "curriculum.high=0.5",
            f"run.output_dir={out}",
            *extra,
        ],
    )
    return GRPOTrainer(build_tiny_model(tok, seed=0), [first_char_reward], ROWS, config=cfg, tokenizer=tok)


def test_curriculum_trains_only_on_the_band(tmp_path):
    trainer = _trainer(tmp_path / "run", "run.max_steps=4")
    drawn: list[set[int]] = []
    trainer.callbacks.append(lambda t, rollout, m: drawn.append((set(rollout.generated_rows), dict(m))))
    trainer.train()
    trainer.close()
    rates = trainer.curriculum.pass_rates
    assert sorted(rates) == list(range(len(ROWS)))
    band = {i for i, p in rates.items() if 0.05 <= p <= 0.5}
    assert 0 < len(band) < len(ROWS), rates  # the test needs prompts on both sides of the band
    assert set(trainer.sampler.active) == band
    rows, metrics = drawn[-1]
    assert rows <= band  # step 3 drew after the step-2 measurement
    assert metrics.get("curriculum/active_prompts") is None  # measured at steps 0 and 2 only
    step2 = drawn[2][1]
    assert step2["curriculum/active_prompts"] == len(band)
    assert step2["curriculum/mastered_prompts"] + step2["curriculum/unsolved_prompts"] == len(ROWS) - len(band)


def test_curriculum_state_survives_resume(tmp_path):
    out = tmp_path / "run"
    first = _trainer(out, "run.max_steps=1")
    first.train()
    first.close()
    resumed = _trainer(out, "run.max_steps=2", "run.resume=true")
    resumed.resume()
    assert resumed.curriculum.pass_rates == first.curriculum.pass_rates
    assert resumed.sampler.active == first.sampler.active
    resumed.close()


def test_sampler_active_subset_order_is_seeded_and_complete():
    sampler = PromptSampler(10, seed=3)
    sampler.set_active([7, 2, 5])
    assert sorted(sampler.next(3)) == [2, 5, 7]
    assert sorted(sampler.next(6)) == [2, 2, 5, 5, 7, 7]
    other = PromptSampler(10, seed=3)
    other.load_state_dict(sampler.state_dict())
    assert other.next(4) == sampler.next(4)
    sampler.set_active(None)
    assert sorted(sampler.next(10)) == list(range(10))

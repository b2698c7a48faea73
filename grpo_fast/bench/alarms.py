"""The health alarms provoked on purpose, and a healthy run, with the margin of each rule to its threshold.

Every run is the tiny model on CPU (transformers engine) on the demo's task `(a*7)%10=`, after a cold-start SFT
from a noisy teacher. A recipe names the alarms it must fire; `run_recipe` trains it and returns, per alarm, the
steps it fired and its margin there (grpo_fast.trainer.health.margins: the main reading over its threshold), and,
per alarm, the largest margin the run reached at any step where the rule's other conditions held (for a run where
it must not fire, how near it came). Used by benchmarks/bench_health_alarms.py and tests/trainer/test_health.py.
"""

from __future__ import annotations

import copy
import math
import random
import tempfile
from dataclasses import dataclass, field

from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rewards.tasks import exact_match_reward
from grpo_fast.rollout.hf_engine import HFEngine
from grpo_fast.sft.in_memory import sft_train
from grpo_fast.trainer.health import margins

TASK = dict(modulus=10, max_operand=1000, ops="*", fixed_b=7)


def longer_is_better(prompts, completions, **_):
    """A hackable verifier: pays for length, whatever the answer."""
    return [math.sqrt(len(c)) / 4.0 for c in completions]


class StaleWeightsEngine(HFEngine):
    """The transformers engine on its own copy of the policy, taken when the run starts and never updated: its
    `load_weights` takes the stream and keeps nothing, as a broken weight sync would. Every step samples from a
    policy further behind the trained one (the rollout/trainer logprob mismatch grows)."""

    name = "stale_weights"

    @classmethod
    def from_config(cls, config, *, options, model, tokenizer, export_model):
        return cls(copy.deepcopy(model).eval().requires_grad_(False), tokenizer, options.batch_size, owns_model=True)

    def load_weights(self, weights):
        for _ in weights:  # consumed, not copied
            pass
        return {"sync/seconds": 0.0, "sync/bytes": 0.0, "sync/buckets": 0.0}


@dataclass(frozen=True)
class Recipe:
    """A run: reward functions, config overrides, the alarms it must fire (none: a healthy run), the cold start (the
    SFT teacher's share of right answers and SFT steps; 0 steps: the random-init model) and whether it has a
    held-out set."""

    name: str
    rewards: tuple
    overrides: tuple[str, ...]
    fires: tuple[str, ...]
    teacher_right: float = 0.0
    sft_steps: int = 0
    evals: bool = True
    min_margin: float = 1.5  # how far past its threshold each alarm of `fires` must go (peak margin)
    doc: str = ""


RECIPES = {
    r.name: r
    for r in (
        Recipe(
            "length_paying_verifier",
            (exact_match_reward, longer_is_better),
            ("health.window=5", "rollout.max_completion_length=16", "run.max_steps=20", "optim.lr=5e-3")
            + ("run.eval_every=5", "health.audit_every=5"),
            ("length_inflation", "reward_hacking"),
            teacher_right=0.3,
            sft_steps=60,
            min_margin=1.0,  # reward_hacking's verifier split: exact match (~0.3) can fall by 0.3 at most
            doc="a weak SFT model paid for length beside its exact-match reward",
        ),
        Recipe(
            "destructive_learning_rate",
            (longer_is_better,),
            ("health.window=5", "rollout.max_completion_length=6", "run.max_steps=10", "optim.lr=1e-1"),
            ("entropy_collapse",),
            evals=False,
            doc="the random-init model at learning rate 1e-1",
        ),
        Recipe(
            "unsolvable_start",
            (exact_match_reward,),
            ("health.window=5", "rollout.max_completion_length=4", "run.max_steps=10", "optim.lr=1e-3"),
            ("no_signal",),
            evals=False,
            min_margin=1.1,  # a share: stuck_share / stuck_max is 1.11 at most (every group stuck)
            doc="the random-init model on exact match: it answers none of the prompts",
        ),
        Recipe(
            "stale_rollouts",
            (exact_match_reward,),
            ("health.window=3", "rollout.max_completion_length=4", "run.max_steps=12", "optim.lr=3e-2")
            + ("grpo.num_iterations=8", "run.eval_every=2"),
            ("collapse",),
            teacher_right=0.9,
            sft_steps=80,
            doc="a good SFT model, eight updates per rollout at learning rate 3e-2",
        ),
        Recipe(
            "broken_weight_sync",
            (exact_match_reward,),
            ("health.window=3", "rollout.max_completion_length=4", "run.max_steps=12", "optim.lr=3e-3")
            + (f"rollout.engine={__name__}:StaleWeightsEngine",),
            ("off_policy_drift",),
            teacher_right=0.9,
            sft_steps=80,
            evals=False,
            doc="a good SFT model whose rollouts come from its starting weights (StaleWeightsEngine), lr 3e-3",
        ),
        Recipe(
            "healthy",
            (exact_match_reward,),
            ("health.window=5", "rollout.max_completion_length=4", "run.max_steps=20", "optim.lr=1e-3")
            + ("run.eval_every=4",),
            (),
            teacher_right=0.9,
            sft_steps=80,
            doc="a good SFT model at the demo's learning rate, 1e-3",
        ),
    )
}


@dataclass
class RecipeResult:
    recipe: str
    seed: int
    fired: dict[str, list[int]] = field(default_factory=dict)  # alarm -> steps it fired
    margin_at_fire: dict[str, float] = field(default_factory=dict)  # alarm -> its margin the first time it fired
    peak_margin: dict[str, float] = field(default_factory=dict)  # alarm -> largest margin where the others held
    peak_any: dict[str, float] = field(default_factory=dict)  # alarm -> largest margin at any step
    seconds: float = 0.0


def sft_model(tokenizer, right: float, steps: int, seed: int = 0):
    """The tiny model after a cold-start SFT on "(a*7)%10=" -> the digit, from a teacher right a `right` share of
    the time (no SFT when steps is 0)."""
    model = build_tiny_model(tokenizer, seed=seed)
    if steps:
        rows = modular_arithmetic_dataset(200, seed=2, **TASK)
        rng = random.Random(seed)
        pairs = [(r["prompt"], r["answer"] if rng.random() < right else str((int(r["answer"]) + 1) % 10)) for r in rows]
        sft_train(model, tokenizer, pairs, steps=steps, batch_size=64, lr=3e-3, seed=seed)
    return model


def build_trainer(recipe: Recipe, seed: int, output_dir, model=None, tokenizer=None, extra=()):
    """The recipe's GRPOTrainer (seeded), on a fresh SFT model unless `model` is given (it is copied). The SFT
    model is seed 0's for every seed: the seed varies the RL run (sampling, data order), not the starting model
    (seed 1's SFT model, for one, loses held-out accuracy under RL at any learning rate tried, 3e-4 to 1e-3, and
    `collapse` rightly fires there)."""
    from grpo_fast.trainer import GRPOTrainer, load_config

    tokenizer = tokenizer or build_char_tokenizer()
    if model is None:
        model = sft_model(tokenizer, recipe.teacher_right, recipe.sft_steps, seed=0)
    opts = ["rollout.engine=hf", "rollout.num_generations=8", "run.prompts_per_step=8", "run.progress=false"]
    opts += ["run.report_to=[]", "run.plots=false", "run.save_final=false", "reward.workers=0"]
    opts += ["check.difficulty_prompts=8", "check.difficulty_samples=4", f"run.output_dir={output_dir}"]
    opts += [f"run.seed={seed}", *recipe.overrides, *extra]
    if not recipe.evals:
        opts.append("run.eval_every=0")
    rows = modular_arithmetic_dataset(200, seed=2, **TASK)
    held_out = modular_arithmetic_dataset(32, seed=1, **TASK) if recipe.evals else None
    return GRPOTrainer(
        copy.deepcopy(model),
        list(recipe.rewards),
        rows,
        config=load_config(None, opts),
        eval_dataset=held_out,
        tokenizer=tokenizer,
    )


def margins_of_run(history: list[dict], thresholds) -> tuple[dict[str, float], dict[str, float]]:
    """From a run's metric rows (their health/reading/... entries): per alarm, the largest margin at a step where
    the rule's other conditions held, and the largest at any step."""
    peak, peak_any = {}, {}
    for row in history:
        readings = {k.removeprefix("health/reading/"): v for k, v in row.items() if k.startswith("health/reading/")}
        for alarm, (ratio, others) in margins(readings, thresholds).items():
            peak_any[alarm] = max(peak_any.get(alarm, -math.inf), ratio)
            if others:
                peak[alarm] = max(peak.get(alarm, -math.inf), ratio)
    return peak, peak_any


def summarize(trainer, recipe: str, seed: int, seconds: float = 0.0) -> RecipeResult:
    """The alarms a trained run fired, their margins, and the run's peak margins."""
    t = trainer.config.health
    result = RecipeResult(recipe, seed, seconds=seconds)
    for alarm in trainer.health.alarms:
        result.fired.setdefault(alarm.name, []).append(alarm.step)
        if alarm.name not in result.margin_at_fire:
            ratio, others = margins(alarm.readings, t)[alarm.name]
            assert others, (alarm, alarm.readings)  # it fired, so its other conditions held
            result.margin_at_fire[alarm.name] = ratio
    result.peak_margin, result.peak_any = margins_of_run(trainer.metrics.history, t)
    return result


def run_recipe(name: str, seed: int, model=None, tokenizer=None) -> RecipeResult:
    """Trains recipe `name` with `seed` in a temporary directory; its alarms and margins."""
    import time

    with tempfile.TemporaryDirectory() as work:
        trainer = build_trainer(RECIPES[name], seed, work, model=model, tokenizer=tokenizer)
        start = time.perf_counter()
        try:
            trainer.train()
        finally:
            trainer.close()
        return summarize(trainer, name, seed, time.perf_counter() - start)

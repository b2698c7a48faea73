"""The launch checklist: checks before a run, alarms during it, the audit trail and the report after it.
Each alarm is provoked on purpose with the tiny model on CPU (transformers engine) and must fire with the
numbers that caused it; the rules are also checked on synthetic metric series."""

from __future__ import annotations

import copy
import json

import pytest

from grpo_fast.bench import alarms
from grpo_fast.bench.alarms import RECIPES, TASK, build_trainer, run_recipe, summarize
from grpo_fast.core.tiny_models import build_char_tokenizer, build_tiny_model
from grpo_fast.data.tasks import modular_arithmetic_dataset
from grpo_fast.rewards.registry import reward
from grpo_fast.rewards.self_test import Sample
from grpo_fast.rewards.tasks import exact_match_reward
from grpo_fast.trainer import GRPOTrainer, load_config
from grpo_fast.trainer.health import HealthMonitor, HealthThresholds, margins
from grpo_fast.trainer.preflight import PreflightError

MARGIN = 1.5
"""The healthy run stays below 1 / MARGIN of each threshold; each provoked alarm's main reading goes its recipe's
`min_margin` (1.5 but for one, grpo_fast.bench.alarms) times past its threshold while the rule's other conditions
hold (grpo_fast.trainer.health.margins): neither passes by a hair."""


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def _sft(tokenizer, right: float, steps: int):
    """The tiny model after a cold-start SFT on "(a*7)%10=" -> the digit, from a teacher right a `right`
    share of the time: it answers short."""
    return alarms.sft_model(tokenizer, right, steps, seed=0)


@pytest.fixture(scope="module")
def sft_model(tokenizer):
    return _sft(tokenizer, right=0.9, steps=80)


@pytest.fixture(scope="module")
def weak_sft_model(tokenizer):
    return _sft(tokenizer, right=0.3, steps=60)


def _trainer(tmp_path, model, tokenizer, funcs, overrides, evals=True):
    opts = ["rollout.engine=hf", "rollout.num_generations=8", "run.prompts_per_step=8", "run.progress=false"]
    opts += ["run.report_to=[]", "run.plots=false", "run.save_final=false", "reward.workers=0"]
    opts += ["check.difficulty_prompts=8", "check.difficulty_samples=4", f"run.output_dir={tmp_path}", *overrides]
    rows = modular_arithmetic_dataset(200, seed=2, **TASK)
    held_out = modular_arithmetic_dataset(32, seed=1, **TASK) if evals else None
    return GRPOTrainer(
        copy.deepcopy(model), funcs, rows, config=load_config(None, opts), eval_dataset=held_out, tokenizer=tokenizer
    )


def _alarms(trainer, name):
    return [a for a in trainer.health.alarms if a.name == name]


# -- provoked in real runs ------------------------------------------------------------------------------


def _provoke(tmp_path, name, model, tokenizer, extra=()):
    """Recipe `name` of grpo_fast.bench.alarms trained with seed 0: (the trainer, its alarms and margins). Each
    alarm the recipe is for must fire, and its reading must go at least MARGIN times past the threshold while
    the rule's other conditions hold (a rule fires on the first window over its threshold, so the reading at
    that step is near it for a failure that builds up; how far the run goes past it is what tells a provoked
    failure from noise)."""
    trainer = build_trainer(RECIPES[name], 0, tmp_path, model=model, tokenizer=tokenizer, extra=extra)
    trainer.train()
    result = summarize(trainer, name, 0)
    for alarm in RECIPES[name].fires:
        assert alarm in result.fired and result.peak_margin[alarm] >= RECIPES[name].min_margin, (alarm, result)
    return trainer, result


def test_a_length_paying_verifier_fires_length_inflation_and_reward_hacking(tmp_path, weak_sft_model, tokenizer):
    trainer, _ = _provoke(tmp_path, "length_paying_verifier", weak_sft_model, tokenizer)
    (inflation, *_) = _alarms(trainer, "length_inflation")
    history = [r for r in trainer.metrics.history if "completion/length_mean" in r]
    before = sum(r["completion/length_mean"] for r in history[:5]) / 5
    assert f"mean length {before:.1f} ->" in inflation.message and "reward by length quartile" in inflation.message
    hacking = " ".join(a.message for a in _alarms(trainer, "reward_hacking"))
    assert "longer_is_better +" in hacking and "exact_match_reward -" in hacking  # one verifier rises, one falls
    last = trainer.metrics.history[-1]
    assert last["health/alarms_total"] == len(trainer.health.alarms) >= 2
    assert {"health/reading/length_rise", "health/reading/verifier_split"} <= last.keys()  # each step's readings
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert {r["step"] for r in audit} == {5, 10, 15, 20} and {"top", "bottom"} <= {r["rank"] for r in audit}
    assert set(audit[0]["rewards"]) == {"exact_match_reward", "longer_is_better"} and audit[0]["prompt"]
    assert "<table>" in (tmp_path / "audit.html").read_text()
    report = (tmp_path / "report.md").read_text()
    assert "**length_inflation**" in report and "## Dashboard" in report and "## Audit samples" in report


def test_a_destructive_learning_rate_fires_entropy_collapse(tmp_path, tokenizer):
    trainer, _ = _provoke(tmp_path, "destructive_learning_rate", build_tiny_model(tokenizer, seed=0), tokenizer)
    (alarm,) = _alarms(trainer, "entropy_collapse")
    w = trainer.config.health.window
    steps = trainer.metrics.history[alarm.step - 2 * w : alarm.step]
    first = sum(r["entropy"] for r in steps[:w]) / w
    last = sum(r["entropy"] for r in steps[w:]) / w
    assert f"entropy {first:.3f} -> {last:.3f}" in alarm.message
    assert alarm.readings["entropy_fall"] == pytest.approx(1 - last / first)


def test_stale_rollouts_collapse_and_stop_the_run_with_a_checkpoint(tmp_path, sft_model, tokenizer):
    extra = ("run.save_every=2", "health.stop_on=[collapse]")
    trainer, _ = _provoke(tmp_path, "stale_rollouts", sft_model, tokenizer, extra)
    (collapse,) = _alarms(trainer, "collapse")
    evals = [r["eval/accuracy"] for r in trainer.metrics.history if "eval/accuracy" in r]
    drop = max(evals) - evals[-1]
    assert f"held-out accuracy {evals[-1]:.3f} is {drop:.3f} below its best" in collapse.message
    assert trainer.step == collapse.step < 12  # stopped early ...
    assert (tmp_path / "checkpoints" / f"step-{trainer.step:06d}").is_dir()  # ... with a checkpoint


def test_a_broken_weight_sync_fires_off_policy_drift(tmp_path, sft_model, tokenizer):
    trainer, result = _provoke(tmp_path, "broken_weight_sync", sft_model, tokenizer)
    (drift, *_) = _alarms(trainer, "off_policy_drift")
    key = "mismatch/abs_logprob_diff_mean"
    rows = [r[key] for r in trainer.metrics.history if key in r and r["step"] <= drift.step]
    mismatch = sum(rows[-trainer.config.health.window :]) / len(rows[-trainer.config.health.window :])
    assert f"mismatch {mismatch:.4f} (max 0.05)" in drift.message
    assert set(result.fired) == {"off_policy_drift"}  # the policy itself trains sanely


def test_the_demo_task_trained_sanely_raises_no_alarm(tmp_path, sft_model, tokenizer):
    trainer = build_trainer(RECIPES["healthy"], 0, tmp_path, model=sft_model, tokenizer=tokenizer)
    trainer.train()
    assert trainer.health.alarms == []
    assert "- none fired" in (tmp_path / "report.md").read_text()
    result = summarize(trainer, "healthy", 0)
    assert set(result.peak_any) == {"entropy_collapse", "length_inflation", "off_policy_drift", "collapse"}
    assert all(margin <= 1 / MARGIN for margin in result.peak_margin.values()), result


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_each_alarm_fires_with_margin_and_the_healthy_run_fires_none_with_other_seeds(seed):
    for name, recipe in RECIPES.items():
        result = run_recipe(name, seed)
        if not recipe.fires:
            assert result.fired == {} and all(m <= 1 / MARGIN for m in result.peak_margin.values()), result
        for alarm in recipe.fires:
            assert alarm in result.fired and result.peak_margin[alarm] >= recipe.min_margin, result


# -- before the run ---------------------------------------------------------------------------------------


def test_preflight_on_an_unsolvable_task_warns_of_zero_variance(tmp_path, tokenizer):
    trainer = _trainer(
        tmp_path,
        build_tiny_model(tokenizer, seed=0),
        tokenizer,
        [exact_match_reward],
        ["rollout.max_completion_length=4"],
    )
    report = trainer.preflight()
    assert report.difficulty["frac_always_fail"] == 1.0 and report.difficulty["frac_zero_variance"] == 1.0
    assert any("zero reward variance" in w and "10% and 90%" in w for w in report.warnings)
    assert report.baselines["start/accuracy"] == 0.0
    assert not report.self_test_failures and {r.function for r in report.self_test} == {"exact_match_reward"}
    trainer.close()


def test_preflight_refuses_a_verifier_that_pays_a_bad_sample(tmp_path, tokenizer):
    samples = [
        Sample("right", "4", {"answer": "4"}, True),
        Sample("every digit listed", "0 1 2 3 4 5 6 7 8 9", {"answer": "4"}, False),
    ]

    @reward(kind="accuracy", range=(0.0, 1.0), samples=samples)
    def contains_answer(prompts, completions, answer, **_):  # a prefix-matching verifier: gameable
        return [float(str(a) in c) for c, a in zip(completions, answer, strict=True)]

    trainer = _trainer(tmp_path, build_tiny_model(tokenizer, seed=0), tokenizer, [contains_answer], [])
    with pytest.raises(PreflightError, match="good sample 'right' scores 1.0, not above bad sample 'every digit"):
        trainer.preflight()
    trainer.close()


def test_preflight_warns_about_reward_scale(tmp_path, tokenizer):
    specs = ["exact_match", "think_format", {"name": "length_penalty", "target_length": 4}]
    opts = ["check.difficulty_prompts=0", f"reward.funcs={json.dumps(specs)}", "reward.weights=[1.0, 2.5, 1.0]"]
    trainer = _trainer(tmp_path, build_tiny_model(tokenizer), tokenizer, specs, opts, False)
    report = trainer.preflight()
    assert any("length_penalty is unbounded" in w for w in report.warnings)
    assert any(
        "think_format is worth 0.500, more than 20% of the accuracy rewards (1.000)" in w for w in report.warnings
    )
    assert {r.function for r in report.self_test} == {"exact_match_reward", "think_format", "length_penalty"}
    trainer.close()


def test_every_builtin_verifier_passes_its_own_self_test(tmp_path, tokenizer):
    from grpo_fast.rewards.registry import REWARD_FUNCTIONS
    from grpo_fast.rewards.self_test import info_of

    builtins = [n for n in REWARD_FUNCTIONS.names() if REWARD_FUNCTIONS.get(n).__module__.startswith("grpo_fast.")]
    assert len(builtins) == 11 and all(info_of(REWARD_FUNCTIONS.get(n))[0] for n in builtins)  # each declares itself
    options = {"overlong_penalty": {"overlong_buffer": 4}, "length_penalty": {"target_length": 4}}
    specs = [{"name": n, **options.get(n, {})} for n in builtins]
    trainer = _trainer(tmp_path, build_tiny_model(tokenizer), tokenizer, specs, ["check.difficulty_prompts=0"], False)
    report = trainer.preflight()
    assert not report.self_test_failures
    # Every verifier ships samples; the learned reward model cannot (no model is bundled) and is never called here.
    assert {r.function for r in report.self_test} == set(trainer.rewards.names) - {"reward_model"}
    assert any("reward reward_model has no self-test samples" in w for w in report.warnings)
    bad = {r.sample for r in report.self_test if not r.good}
    assert {"many answers listed", "answer outside the slot", "forged test output"} <= bad
    trainer.close()


# -- the rules on synthetic metric series ------------------------------------------------------------------


def _series(n, **metrics):
    """n steps of metrics; each value a constant or a function of the step index."""
    return [{k: (v(i) if callable(v) else v) for k, v in metrics.items()} for i in range(n)]


def test_rules_stay_quiet_on_a_healthy_learning_run():
    """Entropy falls and all-correct groups appear, but the reward rises: learning, not collapse."""
    monitor = HealthMonitor(HealthThresholds(window=5), ["exact_match"])
    healthy = _series(
        30,
        **{
            "entropy": lambda i: 0.6 * 0.97**i,
            "frac_zero_var_groups": lambda i: 0.2 + 0.02 * i,
            "frac_stuck_groups": 0.05,
            "reward/mean": lambda i: 0.5 + 0.015 * i,
            "reward/exact_match/mean": lambda i: 0.5 + 0.015 * i,
            "completion/length_mean": 2.0,
            "completion/length_p95": 2.0,
            "clip_ratio/region_mean": 0.01,
        },
    )
    for step, metrics in enumerate(healthy, 1):
        assert monitor.observe(step, metrics) == []
    assert monitor.observe_eval(30, 0.8, []) == [] and monitor.observe_eval(35, 0.75, []) == []


def test_reward_hacking_needs_held_out_accuracy_to_fall_not_to_plateau():
    """The demo's learning runs hold their held-out accuracy between two evaluations while the train reward
    rises; that is not evidence of hacking. A fall is."""
    monitor = HealthMonitor(HealthThresholds(window=5), ["exact_match"])
    rising = _series(
        22, **{"reward/mean": lambda i: 0.3 + 0.03 * i, "reward/exact_match/mean": lambda i: 0.3 + 0.03 * i}
    )

    def hacking(steps):
        return [a for step in steps for a in monitor.observe(step, rising[step - 1]) if a.name == "reward_hacking"]

    monitor.observe_eval(0, 0.725, [])
    assert hacking(range(1, 11)) == []
    monitor.observe_eval(10, 0.725, [])  # a plateau
    assert hacking(range(11, 21)) == []
    monitor.observe_eval(20, 0.70, [])  # a fall while the train reward keeps rising
    assert hacking(range(21, 23))


def test_collapse_names_the_last_good_checkpoint_and_alarms_cool_down():
    monitor = HealthMonitor(HealthThresholds(window=4, collapse_drop=0.2), [])
    monitor.observe_eval(0, 0.3, [])
    monitor.observe_eval(10, 0.8, [0, 5, 10])
    (alarm,) = monitor.observe_eval(20, 0.5, [0, 5, 10, 15, 20])
    assert "0.300 below its best, 0.800 at step 10; the last good checkpoint is step-000010" in alarm.message
    assert monitor.observe_eval(22, 0.4, [20]) == []  # within the window after the last alarm
    assert len(monitor.observe_eval(24, 0.4, [20])) == 1


def test_an_sft_control_baseline_is_measured_and_the_policy_restored(tmp_path, tokenizer):
    import torch

    model = build_tiny_model(tokenizer, seed=0)
    trainer = _trainer(tmp_path, model, tokenizer, [exact_match_reward], ["check.difficulty_prompts=0"])
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    control = [
        {"prompt": r["prompt"], "completion": r["answer"]} for r in modular_arithmetic_dataset(200, seed=2, **TASK)
    ]
    report = trainer.preflight(sft_control_rows=control)
    assert report.baselines["start/accuracy"] == 0.0 and report.baselines["sft_control/accuracy"] > 0.1
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the policy itself is untouched
    assert trainer.evaluate()["eval/accuracy"] == 0.0
    trainer.close()


def test_margins_say_a_rule_fires_exactly_when_it_fires():
    """The readings each step records give margins >= 1 with the other conditions holding on the step an alarm
    fires, and below 1 (or another condition failing) on every step before it."""
    t = HealthThresholds(window=3)
    series = {
        "entropy_collapse": dict(
            entropy=lambda i: 1.0 if i < 4 else 1.0 - 0.08 * (i - 3),
            frac_stuck_groups=lambda i: 0.0 if i < 4 else 0.08 * (i - 3),
            **{"reward/mean": 0.3, "completion/length_mean": 4.0, "completion/length_p95": 5.0},
        ),
        "length_inflation": dict(
            entropy=1.0,
            frac_stuck_groups=0.0,
            **{"reward/mean": 0.3, "completion/length_mean": lambda i: 4.0 * 1.1**i},
            **{"completion/length_p95": lambda i: 5.0 * 1.1**i},
        ),
        "off_policy_drift": dict(
            entropy=1.0, **{"clip_ratio/region_mean": lambda i: 0.03 * i, "mismatch/abs_logprob_diff_mean": 0.0}
        ),
    }
    for name, metrics in series.items():
        monitor = HealthMonitor(t, [])
        for step, row in enumerate(_series(20, **metrics), 1):
            fired = [a.name for a in monitor.observe(step, row)]
            ratio, others = margins(monitor.readings, t).get(name, (0.0, False))
            if name in fired:
                assert ratio >= 1 and others, (name, step, monitor.readings)
                (alarm,) = [a for a in monitor.alarms if a.name == name]
                assert margins(alarm.readings, t)[name] == (ratio, others)
                break
            assert not (ratio > 1 and others), (name, step, monitor.readings)  # it would have fired
        else:
            raise AssertionError(f"{name} never fired")
    monitor = HealthMonitor(HealthThresholds(window=2, collapse_drop=0.2), [])
    monitor.observe_eval(0, 0.8, [])
    assert monitor.observe_eval(2, 0.65, []) == [] and margins(monitor.readings, monitor.t)["collapse"][0] < 1
    (alarm,) = monitor.observe_eval(4, 0.5, [])
    assert margins(alarm.readings, monitor.t)["collapse"] == (pytest.approx(1.5), True)

"""The launch checklist: checks before a run, alarms during it, the audit trail and the report after it.
Each alarm is provoked on purpose with the tiny model on CPU (transformers engine) and must fire with the
numbers that caused it; the rules are also checked on synthetic metric series."""

from __future__ import annotations

import copy
import json
import math

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


def _trainer(tmp_path, model, tokenizer, funcs, overrides, evals=True, columns=()):
    """The trainer of these tests on the modular-arithmetic rows (with the extra `columns`, empty, for rewards that
    need them)."""
    opts = ["rollout.engine=hf", "rollout.num_generations=8", "run.prompts_per_step=8", "run.progress=false"]
    opts += ["run.report_to=[]", "run.plots=false", "run.save_final=false", "reward.workers=0"]
    opts += ["check.difficulty_prompts=8", "check.difficulty_samples=4", f"run.output_dir={tmp_path}", *overrides]
    rows = [{**dict.fromkeys(columns, ""), **row} for row in modular_arithmetic_dataset(200, seed=2, **TASK)]
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
    w, at = trainer.config.health.window, inflation.step  # the reference the alarm names, by its numbers
    before = sum(r["completion/length_mean"] for r in history[at - 2 * w : at - w]) / w
    named = {"against the run's start (step 1)": history[0]["completion/length_mean"], "the window before": before}
    assert any(f"mean length {v:.1f} ->" in inflation.message and k in inflation.message for k, v in named.items())
    assert "reward by length quartile" in inflation.message
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


def test_a_start_that_solves_nothing_fires_no_signal(tmp_path, tokenizer):
    trainer, _ = _provoke(tmp_path, "unsolvable_start", build_tiny_model(tokenizer, seed=0), tokenizer)
    (alarm, *_) = _alarms(trainer, "no_signal")
    w = trainer.config.health.window
    stuck = sum(r["frac_stuck_groups"] for r in trainer.metrics.history[alarm.step - w : alarm.step]) / w
    assert alarm.step == w and f"{stuck:.0%} of the groups of the last {w} steps were stuck" in alarm.message
    assert "length_inflation" not in {a.name for a in trainer.health.alarms}


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
    assert set(result.peak_any) == {"entropy_collapse", "length_inflation", "off_policy_drift", "collapse", "no_signal"}
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


def test_off_policy_drift_reads_the_fresh_tokens_of_a_partial_run(tmp_path):
    """rollout.mode partial trains tokens sampled by older weights on purpose: their rollout/trainer mismatch is the
    staleness the mode intends (and corrects), not a drift, and it fired the alarm from step 2 on. The alarm reads the
    fresh tokens' mismatch (staleness 0)."""
    from tiny_trainer import tiny_trainer

    from grpo_fast.bench.alarms import longer_is_better

    overrides = ("rollout.mode=partial", "rollout.max_completion_length=12", "rollout.partial.segment_tokens=3")
    overrides += ("run.prompts_per_step=4", "rollout.num_generations=4", "optim.lr=3e-2", "run.max_steps=6")
    overrides += ("health.window=2", "health.preflight=false")
    trainer = tiny_trainer(tmp_path, *overrides, rewards=(longer_is_better,))
    trainer.train()
    trainer.close()
    rows = [r for r in trainer.metrics.history if "mismatch/abs_logprob_diff_mean" in r]
    stale = [r for r in rows if any(k.startswith("mismatch/abs_logprob_diff_staleness_") for k in r)]
    assert stale and max(r["mismatch/abs_logprob_diff_mean"] for r in stale) > 0.05  # all tokens: over the threshold
    key = "mismatch/abs_logprob_diff_staleness_0"
    fresh = [r[key] for r in rows[-2:] if key in r]
    assert fresh and max(fresh) < 1e-3  # the weights that sampled them are the trained ones
    assert [a for a in trainer.health.alarms if a.name == "off_policy_drift"] == []
    assert trainer.health.fill_steps == trainer.config.rollout.max_staleness == 4
    assert trainer.metrics.history[-1]["health/reading/mismatch"] == pytest.approx(sum(fresh) / len(fresh))


# A partial-mode run of the long-tail task (`benchmarks/bench_async.py --task long_tail --variants partial_coupled
# --set grpo.num_iterations=2`, seed 0), steps 1-30 as recorded: steps 1-3 train only the completions that finished
# first (5 tokens; a tenth of this task's completions run to ~500) while the pipeline fills.
LONG_TAIL_PARTIAL = {
    "completion/length_mean": [5.0, 5.0, 7.8, 74.2, 31.5, 81.6, 29.3, 55.0, 14.6, 72.9, 27.3, 45.3, 23.1, 35.5, 66.1]
    + [95.1, 131.0, 151.3, 88.3, 5.0, 87.3, 110.1, 81.5, 93.4, 66.0, 69.5, 5.0, 85.2, 80.0, 100.0],
    "completion/length_p95": [5.0, 5.0, 5.0, 395.6, 363.6, 421.0, 375.6, 412.8, 5.0, 443.6, 7.0, 478.0, 5.0, 452.8]
    + [512.0, 512.0, 512.0, 467.6, 424.0, 5.0, 424.0, 425.0, 423.0, 423.6, 428.0, 428.0, 5.0, 424.0, 425.0, 433.0],
    "reward/mean": [0.133, 0.078, 0.125, 0.102, 0.078, 0.188, 0.281, 0.141, 0.227, 0.141, 0.164, 0.125, 0.344, 0.148]
    + [0.273, 0.109, 0.094, 0.07, 0.203, 0.07, 0.195, 0.141, 0.195, 0.273, 0.156, 0.258, 0.055, 0.164, 0.016, 0.25],
    "frac_stuck_groups": [0.312, 0.688, 0.562, 0.438, 0.75, 0.5, 0.25, 0.5, 0.438, 0.625, 0.438, 0.5, 0.375, 0.375]
    + [0.438, 0.5, 0.438, 0.75, 0.438, 0.625, 0.562, 0.562, 0.625, 0.438, 0.188, 0.438, 0.812, 0.625, 0.875, 0.562],
    "entropy": [0.443, 0.447, 0.282, 0.042, 0.077, 0.038, 0.074, 0.053, 0.147, 0.04, 0.085, 0.055, 0.074, 0.063]
    + [0.036, 0.034, 0.03, 0.026, 0.035, 0.414, 0.04, 0.036, 0.036, 0.039, 0.045, 0.041, 0.386, 0.043, 0.052, 0.041],
}


def test_a_partial_runs_pipeline_fill_is_no_reference_for_the_windowed_rules():
    """Compared with step 1's 5-token completions, every later window of a partial run is "longer, not better"
    (length_inflation fired at steps 11 and 21 on each of the ten runs of that benchmark). With the fill
    (max_staleness steps) left out, the rules first compare at step fill + 2 x window, against the first window
    after the fill."""
    rows = [
        dict(zip(LONG_TAIL_PARTIAL, values, strict=True)) for values in zip(*LONG_TAIL_PARTIAL.values(), strict=True)
    ]

    def alarms(fill):
        monitor = HealthMonitor(HealthThresholds(window=10), [], fill_steps=fill)
        return [a for step, row in enumerate(rows, 1) for a in monitor.observe(step, row)]

    first = alarms(0)[0]
    assert (first.step, first.name) == (11, "length_inflation") and "the run's start (step 1)" in first.message
    fired = alarms(4)
    assert fired and all(a.step >= 24 for a in fired)
    reference = sum(LONG_TAIL_PARTIAL["completion/length_mean"][4:14]) / 10
    inflation = [a for a in fired if a.name == "length_inflation"]
    assert all("the run's first window after the fill (steps 5-14)" in a.message for a in inflation)
    assert all(f"mean length {reference:.1f} ->" in a.message for a in inflation)


def test_off_policy_drift_fires_on_fresh_tokens_that_differ():
    """A partial run whose fresh tokens differ from the trainer's (weights not synced) still fires."""
    monitor = HealthMonitor(HealthThresholds(window=2), [])
    row = {"mismatch/abs_logprob_diff_mean": 0.3, "mismatch/abs_logprob_diff_staleness_0": 0.08}
    row |= {"mismatch/abs_logprob_diff_staleness_2": 0.5}
    assert not monitor.observe(1, row)  # a window of one step is no evidence
    assert monitor.observe(2, row) and "mismatch of the fresh tokens (staleness 0) 0.0800" in monitor.alarms[0].message


def test_off_policy_drift_reads_no_mismatch_under_truncated_sampling():
    """top_p 0.9: the engine's renormalised logprobs sit -log(kept mass) ~ 0.1 above the trainer's by design, which
    fired the alarm at step 1 of every such run; the clipped fraction still fires it."""
    quiet, clipping = (
        HealthMonitor(HealthThresholds(window=2), [], truncated=True),
        HealthMonitor(HealthThresholds(window=2), [], truncated=True),
    )
    for step in (1, 2, 3):
        assert not quiet.observe(step, {"mismatch/abs_logprob_diff_mean": 0.1, "clip_ratio/region_mean": 0.0})
    fired = [
        clipping.observe(step, {"mismatch/abs_logprob_diff_mean": 0.1, "clip_ratio/region_mean": 0.5})
        for step in (1, 2)
    ]
    assert not fired[0] and fired[1][0].name == "off_policy_drift"


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
    from grpo_fast.rewards.columns import required_columns
    from grpo_fast.rewards.registry import REWARD_FUNCTIONS
    from grpo_fast.rewards.self_test import info_of

    builtins = [n for n in REWARD_FUNCTIONS.names() if REWARD_FUNCTIONS.get(n).__module__.startswith("grpo_fast.")]
    assert len(builtins) == 11 and all(info_of(REWARD_FUNCTIONS.get(n))[0] for n in builtins)  # each declares itself
    options = {"overlong_penalty": {"overlong_buffer": 4}, "length_penalty": {"target_length": 4}}
    specs = [{"name": n, **options.get(n, {})} for n in builtins]
    columns = {c for n in builtins for c in required_columns(REWARD_FUNCTIONS.get(n))}  # only the self-tests run
    model = build_tiny_model(tokenizer)
    trainer = _trainer(tmp_path, model, tokenizer, specs, ["check.difficulty_prompts=0"], False, columns)
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
    assert (
        monitor.observe_eval(30, 0.8, [], prompts=200) == [] and monitor.observe_eval(35, 0.75, [], prompts=200) == []
    )


def _collapse_alarms(series: list[dict], window: int = 10) -> list:
    monitor = HealthMonitor(HealthThresholds(window=window), [])
    return [a for step, row in enumerate(series, 1) for a in monitor.observe(step, row) if a.name == "entropy_collapse"]


def test_entropy_collapse_catches_a_collapse_too_slow_to_see_from_one_window_to_the_next():
    """Entropy 0.72 -> 0.05 and stuck groups 0.05 -> 0.35 over 60 steps at a flat train reward: no window falls 25%
    below the one before with 0.2 more stuck groups, but since the run's start the policy has collapsed."""
    slow = _series(
        80,
        **{
            "entropy": lambda i: max(0.05, 0.72 * 0.956**i),
            "frac_stuck_groups": lambda i: 0.05 + 0.005 * min(i, 60),
            "reward/mean": lambda i: 0.6 + 0.01 * ((i * 7) % 3 - 1),  # flat, with noise
        },
    )
    (alarm, *_) = _collapse_alarms(slow)
    assert "against the run's first window (steps 1-10)" in alarm.message and alarm.step < 80
    assert alarm.readings["entropy_fall"] >= 0.25 and alarm.readings["stuck_rise"] >= 0.2
    monitor = HealthMonitor(HealthThresholds(window=10), [])
    for step, row in enumerate(slow, 1):
        monitor.observe(step, row)
        previous = monitor._collapse_window(-10)  # the window-to-window comparison alone never fires
        last = monitor._collapse_window(0)
        if previous is not None:
            assert last.stuck - previous.stuck < 0.2


def test_entropy_collapse_compares_with_the_best_train_reward_after_a_run_learned_then_collapsed():
    """The train reward rises 0.3 -> 0.8 over 40 steps (entropy falls, groups go right: learning), then entropy keeps
    falling while stuck groups come back and the reward sags: against the start the reward rose, against its best
    the run collapsed."""
    run = _series(
        100,
        **{
            "entropy": lambda i: 0.72 * 0.97**i,
            "frac_stuck_groups": lambda i: 0.15 - 0.0025 * i if i < 40 else 0.05 + 0.005 * (i - 40),
            "reward/mean": lambda i: 0.3 + 0.0125 * i if i < 40 else 0.8 - 0.002 * (i - 40),
        },
    )
    (alarm, *_) = _collapse_alarms(run)
    assert "against the window of the best train reward so far" in alarm.message and alarm.step > 50
    assert alarm.readings["reward_rise_since"] < 0.1


def test_reward_hacking_needs_held_out_accuracy_to_fall_significantly_not_to_plateau():
    """The demo's learning runs hold their held-out accuracy between two evaluations while the train reward
    rises, or lose a prompt or two of 200 to noise (one prompt is 0.005); that is no evidence of hacking. A fall of
    more than `heldout_sigmas` standard errors is."""
    monitor = HealthMonitor(HealthThresholds(window=5), ["exact_match"])
    rising = _series(
        26, **{"reward/mean": lambda i: 0.3 + 0.025 * i, "reward/exact_match/mean": lambda i: 0.3 + 0.025 * i}
    )

    def hacking(steps):
        return [a for step in steps for a in monitor.observe(step, rising[step - 1]) if a.name == "reward_hacking"]

    monitor.observe_eval(0, 0.725, [], prompts=200)
    assert hacking(range(1, 11)) == []
    monitor.observe_eval(10, 0.725, [], prompts=200)  # a plateau
    assert hacking(range(11, 21)) == []
    monitor.observe_eval(20, 0.70, [], prompts=200)  # 5 prompts of 200: 0.6 standard errors, noise
    assert hacking(range(21, 23)) == [] and -1 < monitor.readings["heldout_sigmas"] < 0
    monitor.observe_eval(22, 0.55, [], prompts=200)  # 0.15 below: 3.1 standard errors
    (alarm,) = hacking(range(23, 25))
    assert "held-out accuracy 0.700 -> 0.550 (3.1 standard errors on 200 prompts)" in alarm.message
    assert margins(alarm.readings, monitor.t)["reward_hacking"][0] >= 1


def test_reward_hacking_stays_silent_on_seed_1s_noise_and_fires_on_a_real_fall():
    """Seed 1 of the demo on another CPU: "train reward 0.682 -> 0.786 while held-out accuracy 0.790 -> 0.785" fired
    the alarm (a fall of one prompt in 200). The same readings on 20 prompts cannot tell a fall of 0.3 from noise
    either; on 200 they can."""
    for prompts, after, fires in ((200, 0.785, False), (200, 0.49, True), (20, 0.49, False), (20, 0.2, True)):
        monitor = HealthMonitor(HealthThresholds(), ["exact_match"])
        monitor.observe_eval(0, 0.79, [], prompts=prompts)
        for step in range(1, 20):
            assert monitor.observe(step, {"reward/mean": 0.682 if step <= 10 else 0.786}) == []
        monitor.observe_eval(20, after, [], prompts=prompts)
        fired = [a.name for a in monitor.observe(20, {"reward/mean": 0.786})]
        assert monitor.readings["reward_rise"] == pytest.approx(0.104)
        assert ("reward_hacking" in fired) == fires, (prompts, after, monitor.readings)


def test_collapse_names_the_last_good_checkpoint_and_alarms_cool_down():
    monitor = HealthMonitor(HealthThresholds(window=4, collapse_drop=0.2), [])
    monitor.observe_eval(0, 0.3, [], prompts=32)
    monitor.observe_eval(10, 0.8, [0, 5, 10], prompts=32, best_model="runs/x/best_model")
    (alarm,) = monitor.observe_eval(20, 0.5, [0, 5, 10, 15, 20], prompts=32, best_model="runs/x/best_model")
    assert "0.300 below its best, 0.800 at step 10; the last good checkpoint is step-000010" in alarm.message
    assert "the best held-out model (step 10) is in runs/x/best_model" in alarm.message
    assert monitor.observe_eval(22, 0.4, [20], prompts=32) == []  # within the window after the last alarm
    assert len(monitor.observe_eval(24, 0.4, [20], prompts=32)) == 1


def test_the_checkpoint_a_collapse_names_outlives_checkpoint_retention(tmp_path):
    """keep_checkpoints 2: the stop's own save pruned the step-2 checkpoint the alarm had just named."""
    from tiny_trainer import tiny_trainer

    options = ("run.save_every=1", "run.keep_checkpoints=2", "run.eval_every=1", "run.max_steps=6")
    trainer = tiny_trainer(tmp_path, *options, "health.stop_on=[collapse]", "health.preflight=false")
    trainer.eval_rows = trainer.train_rows[:2]
    accuracies = iter([0.0, 0.5, 0.9, 0.8, 0.1, 0.1, 0.1])  # step 0, then one a step: best at 2, collapse at 4
    trainer.evaluate = lambda: {"eval/accuracy": next(accuracies)}
    trainer.train()
    trainer.close()
    (alarm,) = [a for a in trainer.health.alarms if a.name == "collapse"]
    assert trainer.step == 4 and "the last good checkpoint is step-000002" in alarm.message
    kept = [p.name for p in sorted((tmp_path / "checkpoints").iterdir())]
    assert kept == ["step-000002", "step-000003", "step-000004"]


def test_a_resumed_run_remembers_the_alarms_and_the_best_evaluation_before_it(tmp_path):
    """A run killed after step 3 and resumed forgot its best held-out accuracy (0.9 at step 2): the collapse at
    step 4 never fired and health.stop_on never stopped it; the report lost the alarms fired before."""
    from tiny_trainer import tiny_trainer

    accuracies = iter([0.0, 0.5, 0.9, 0.8, 0.1, 0.1, 0.1])  # step 0, then one a step: best at 2, collapse at 4
    options = ("run.save_every=1", "run.eval_every=1", "health.stop_on=[collapse]", "health.preflight=false")
    for max_steps, resume in ((3, "false"), (6, "true")):
        trainer = tiny_trainer(tmp_path, *options, f"run.max_steps={max_steps}", f"run.resume={resume}")
        trainer.eval_rows = trainer.train_rows[:2]
        trainer.evaluate = lambda: {"eval/accuracy": next(accuracies)}
        trainer.train()
        trainer.close()
    assert trainer.step == 4 and [a.name for a in trainer.health.alarms] == ["collapse"]
    assert "0.800 below its best, 0.900 at step 2" in trainer.health.alarms[0].message


def test_verifiers_that_part_are_seen_when_one_scores_no_row_at_some_steps():
    """A verifier routed by `when:` logs NaN at a step where no row was its: the rule switched off for any window
    with one such step (with one step in five, it never fired)."""
    monitor = HealthMonitor(HealthThresholds(window=5, reward_rise=0.1), ["a", "b"])
    fired = []
    for step in range(1, 21):
        b = math.nan if step % 5 == 0 else 1.0 - 0.04 * step
        fired += monitor.observe(step, {"reward/mean": 0.5, "reward/a/mean": 0.04 * step, "reward/b/mean": b})
    assert [a.name for a in fired] and {a.name for a in fired} == {"reward_hacking"}
    assert "one verifier rises while another falls" in fired[0].message


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


def test_a_length_paid_for_and_learned_inside_the_first_window_fires_against_the_run_start():
    """A policy that learns a length-paying verifier in two steps (as the length_paying_verifier recipe does on
    some CPUs' rounding): the run's first window already holds the rise, so window against window sees none (it
    fired nothing; the run's entropy_collapse came instead), against the run's start it is 8x."""
    rows = _series(
        20,
        **{
            "entropy": 1.0,
            "frac_stuck_groups": 0.0,
            "completion/length_mean": lambda i: 2.0 if i == 0 else 16.0,
            "completion/length_p95": lambda i: 2.0 if i == 0 else 16.0,
            "reward/mean": lambda i: 0.5 if i == 0 else 1.1,
            "reward/exact_match/mean": lambda i: 0.3 if i == 0 else 0.1,
            "reward/longer_is_better/mean": lambda i: 0.2 if i == 0 else 1.0,
        },
    )
    monitor = HealthMonitor(HealthThresholds(window=5), ["exact_match", "longer_is_better"])
    fired = {}
    for step, row in enumerate(rows, 1):
        for alarm in monitor.observe(step, row):
            fired.setdefault(alarm.name, alarm)  # the first of each
    assert set(fired) == {"length_inflation", "reward_hacking"}
    assert fired["length_inflation"].step == 6 and "mean length 2.0 -> 16.0" in fired["length_inflation"].message
    assert "against the run's start (step 1)" in fired["length_inflation"].message
    assert "longer_is_better +0.800, exact_match -0.200" in fired["reward_hacking"].message


def test_a_length_drifting_where_every_group_is_stuck_fires_no_signal_not_length_inflation():
    """A cold start that solves nothing: every group scores 0, the gradient of the rewards is 0, and the completions
    grow by the optimizer's drift alone. No reward pays for that length, so length_inflation's remedies (a length
    penalty, a token-level loss) do not apply; what the run lacks is a signal."""
    rows = _series(
        20,
        **{
            "entropy": lambda i: 0.2 + 0.01 * i,
            "frac_stuck_groups": 1.0,
            "completion/length_mean": lambda i: 4.0 * 1.05**i,
            "completion/length_p95": lambda i: 6.0 * 1.05**i,
            "reward/mean": 0.0,
            "reward/exact_match/mean": 0.0,
        },
    )
    monitor = HealthMonitor(HealthThresholds(window=5), ["exact_match"])
    fired = [a for step, row in enumerate(rows, 1) for a in monitor.observe(step, row)]
    assert [(a.step, a.name) for a in fired] == [
        (5, "no_signal"),
        (10, "no_signal"),
        (15, "no_signal"),
        (20, "no_signal"),
    ]
    assert "100% of the groups of the last 5 steps were stuck" in fired[0].message
    assert monitor.readings["length_rise"] >= 0.3  # length_inflation's own threshold is crossed, yet it stays quiet


def test_groups_stuck_after_the_reward_rose_are_no_no_signal():
    """A policy that learned to max out a length-paying verifier: every completion at the length limit, every group
    at the same reward. Its groups are stuck too, but the reward rose to get there: that is what reward_hacking and
    length_inflation are for, and no_signal's remedies (a better start) do not apply."""
    rows = _series(
        20,
        **{
            "entropy": 1.0,
            "frac_stuck_groups": lambda i: 0.1 if i < 5 else 1.0,
            "completion/length_mean": lambda i: 2.0 if i < 5 else 16.0,
            "completion/length_p95": lambda i: 2.0 if i < 5 else 16.0,
            "reward/mean": lambda i: 0.5 if i < 5 else 1.0,
        },
    )
    monitor = HealthMonitor(HealthThresholds(window=5), [])
    fired = {a.name for step, row in enumerate(rows, 1) for a in monitor.observe(step, row)}
    assert "no_signal" not in fired and "length_inflation" in fired
    assert monitor.readings["stuck_share"] == 1.0 and monitor.readings["reward_change_from_first"] == 0.5


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
        "no_signal": dict(entropy=1.0, frac_stuck_groups=lambda i: min(1.0, 0.1 * i), **{"reward/mean": 0.0}),
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
    monitor.observe_eval(0, 0.8, [], prompts=32)
    assert (
        monitor.observe_eval(2, 0.65, [], prompts=32) == [] and margins(monitor.readings, monitor.t)["collapse"][0] < 1
    )
    (alarm,) = monitor.observe_eval(4, 0.5, [], prompts=32)
    assert margins(alarm.readings, monitor.t)["collapse"] == (pytest.approx(1.5), True)

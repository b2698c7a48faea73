"""The launch checklist: the checks before a run (`grpo-fast check`, and the first thing `GRPOTrainer.train()`
does, from the command line or from Python, unless health.preflight is false; a resumed run repeats 0 and 1):

0. Verifier start-up: every reward function with a start-up check (grpo_fast.rewards.checks; code_tests runs a
   known-correct and a known-wrong program through its real sandbox) passes it, or the run does not start: a
   verifier that cannot work would score every completion alike. What each found (the sandbox backend) is logged,
   reported and, as reward/<name>/... metrics, recorded at every step; an unprotected one is warned about.
1. Verifier self-test: every reward function scores its known-good and known-bad samples
   (grpo_fast.rewards.self_test; adversarial ones included). A good sample that does not score above
   every bad one of the same function stops the run: the policy would learn the gap.
2. Reward scale: warnings for unbounded rewards and for a format-style reward worth more than a fifth of
   the accuracy rewards (weights included).
3. Prompt difficulty: K samples for each of P training prompts, scored as in training: the share of
   prompts the model always fails, always passes, or sometimes passes. A group whose K rewards are all
   equal teaches nothing; when most are, the run is mostly wasted, and prompts should be filtered to a
   pass rate between 10% and 90%.
4. Baselines: held-out accuracy of the starting model (and, given a dataset, of an SFT control), to
   compare the RL run with in the report.
"""

from __future__ import annotations

import copy
import logging
import math
import random
from dataclasses import asdict, dataclass, field

import torch

from grpo_fast.curate.pass_rates import sample_prompts
from grpo_fast.rewards.checks import check_verifiers
from grpo_fast.rewards.columns import TrainerState, call_reward
from grpo_fast.rewards.outcomes import VerifierStartupError
from grpo_fast.rewards.routing import unrouted
from grpo_fast.rewards.self_test import info_of
from grpo_fast.rollout.prompts import training_sampling
from grpo_fast.sft.in_memory import sft_train
from grpo_fast.trainer.advantages import group_advantages

logger = logging.getLogger(__name__)

FORMAT_SHARE_MAX = 0.2
ZERO_VARIANCE_WARN = 0.5


class PreflightError(RuntimeError):
    """A check that must stop the run failed (a verifier's start-up check or the verifier self-test)."""


@dataclass
class SelfTestResult:
    function: str
    sample: str
    good: bool
    reward: float | None


@dataclass
class PreflightReport:
    startup: dict[str, str] = field(default_factory=dict)
    startup_metrics: dict[str, float] = field(default_factory=dict)
    self_test: list[SelfTestResult] = field(default_factory=list)
    self_test_failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    difficulty: dict = field(default_factory=dict)
    baselines: dict = field(default_factory=dict)

    def text(self) -> str:
        lines = [f"verifier start-up: {name}: {line}" for name, line in self.startup.items()]
        lines += ["verifier self-test:", f"  {'function':<22} {'sample':<30} {'kind':<5} {'reward':>8}"]
        for r in self.self_test:
            reward = "None" if r.reward is None else f"{r.reward:.3f}"
            lines.append(f"  {r.function:<22} {r.sample:<30} {'good' if r.good else 'bad':<5} {reward:>8}")
        lines += [f"  FAILED: {f}" for f in self.self_test_failures] or [
            "  every good sample scores above every bad one"
        ]
        if self.difficulty:
            d = self.difficulty
            lines.append(
                f"prompt difficulty ({d['prompts']} prompts x {d['samples']} samples): always fail "
                f"{d['frac_always_fail']:.0%}, always pass {d['frac_always_pass']:.0%}, sometimes "
                f"{d['frac_sometimes']:.0%}; zero-variance groups {d['frac_zero_variance']:.0%}"
            )
        if self.baselines:
            lines.append("baselines: " + ", ".join(f"{k} {v:.3f}" for k, v in self.baselines.items()))
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return asdict(self)


def verifier_startup(rewards, report: PreflightReport) -> None:
    """The reward functions' start-up checks; PreflightError with the cause when one fails."""
    try:
        statuses = check_verifiers(rewards.funcs)
    except VerifierStartupError as exc:
        raise PreflightError(f"a verifier cannot work here: {exc}") from exc
    for name, status in statuses.items():
        report.startup[name] = status.text
        report.startup_metrics |= {f"reward/{name}/{key}": value for key, value in status.metrics.items()}
        logger.info("verifier %s: %s", name, status.text)
        if status.unsafe:
            report.warnings.append(f"reward {name}: {status.text}")


def verifier_self_test(rewards, report: PreflightReport) -> None:
    """Score every function's samples in this process (code still runs in its sandbox)."""
    state = TrainerState(global_step=0, max_steps=0)
    for fn, name in zip(rewards.funcs, rewards.names, strict=True):
        fn = unrouted(fn)  # the samples test the verifier, not the rows its `when` routes to it
        info, _ = info_of(fn)
        if info is None or not info.samples:
            report.warnings.append(f"reward {name} has no self-test samples (declare them: grpo_fast.rewards.reward)")
            continue
        scored = []
        for sample in info.samples:
            columns = dict(sample.columns)
            ids = columns.pop("completion_ids", [1] * max(len(sample.completion), 1))
            columns = {k: [v] for k, v in columns.items()} | {"completion_ids": [ids]}
            reward = call_reward(fn, ["self-test"], [sample.completion], columns, {"trainer_state": state})[0]
            scored.append(SelfTestResult(name, sample.name, sample.good, reward))
        report.self_test += scored
        good, bad = [r for r in scored if r.good], [r for r in scored if not r.good]
        if good and bad:
            worst_good, best_bad = min(good, key=_value), max(bad, key=_value)
            if _value(worst_good) <= _value(best_bad):
                report.self_test_failures.append(
                    f"{name}: good sample '{worst_good.sample}' scores {worst_good.reward}, not above bad sample "
                    f"'{best_bad.sample}' ({best_bad.reward})"
                )


def _value(result: SelfTestResult) -> float:
    """A reward that could not be given (None) ranks lowest."""
    return -math.inf if result.reward is None else result.reward


def reward_scale_warnings(rewards, report: PreflightReport) -> None:
    widths: dict[str, list[tuple[str, float]]] = {"accuracy": [], "format": []}
    for fn, name, weight in zip(rewards.funcs, rewards.names, rewards.weights, strict=True):
        info, options = info_of(fn)
        if info is None:
            report.warnings.append(f"reward {name} declares no range: its scale against the others is unchecked")
            continue
        low, high = info.reward_range(options)
        if not (math.isfinite(low) and math.isfinite(high)):
            report.warnings.append(
                f"reward {name} is unbounded (range [{low}, {high}]): clip it or scale it to the other rewards"
            )
            continue
        if info.kind in widths:
            widths[info.kind].append((name, abs(weight) * (high - low)))
    accuracy = sum(w for _, w in widths["accuracy"])
    for name, width in widths["format"]:
        if accuracy and width > FORMAT_SHARE_MAX * accuracy:
            report.warnings.append(
                f"format-style reward {name} is worth {width:.3f}, more than {FORMAT_SHARE_MAX:.0%} of the accuracy "
                f"rewards ({accuracy:.3f}): the policy can earn more by formatting than by being right"
            )


def difficulty_probe(trainer, prompts: int, samples: int, report: PreflightReport) -> None:
    """K samples of P training prompts at the run's sampling settings, scored by the run's rewards."""
    cfg = trainer.config
    rng = random.Random(cfg.run.seed)
    index = rng.sample(range(len(trainer.train_rows)), min(prompts, len(trainer.train_rows)))
    spec = training_sampling(cfg.rollout, trainer.stop_ids, samples, cfg.run.seed)
    state = TrainerState(global_step=0, max_steps=cfg.run.max_steps)
    results = sample_prompts(trainer.engine, trainer.rollouts, trainer.train_rows, index, trainer.rewards, spec, state)
    passed = torch.tensor([r.pass_rate for r in results])
    _, zero_var = group_advantages(torch.cat([r.rewards for r in results]), samples, "none")
    report.difficulty = {
        "prompts": len(index),
        "samples": samples,
        "frac_always_fail": float((passed == 0).float().mean()),
        "frac_always_pass": float((passed == 1).float().mean()),
        "frac_sometimes": float(((passed > 0) & (passed < 1)).float().mean()),
        "frac_zero_variance": float(zero_var.float().mean()),
    }
    if report.difficulty["frac_zero_variance"] > ZERO_VARIANCE_WARN:
        report.warnings.append(
            f"{report.difficulty['frac_zero_variance']:.0%} of the probed groups have zero reward variance (no "
            "learning signal): filter the training prompts to a pass rate between 10% and 90%, or make the task "
            "easier (or harder) for this model"
        )


def baselines(trainer, sft_control_rows: list[dict] | None, sft_steps: int, report: PreflightReport) -> None:
    """Held-out accuracy of the starting model; of an SFT control trained on `sft_control_rows`
    ({"prompt", "completion"}) when given. The control is the policy itself, SFT-trained with its own
    optimizer and evaluated through the engine; the policy's weights are restored (and synced) afterwards."""
    if not trainer.eval_rows:
        return
    start = trainer.evaluate()
    report.baselines["start/accuracy"] = start["eval/accuracy"]
    report.baselines["start/reward_mean"] = start["eval/reward_mean"]
    if "eval/tool_call_rate" in start:
        report.baselines["start/tool_call_rate"] = start["eval/tool_call_rate"]
    if not sft_control_rows:
        return

    policy = copy.deepcopy(trainer.model.state_dict())
    pairs = [(r["prompt"], r["completion"]) for r in sft_control_rows]
    try:
        sft_train(trainer.model, trainer.tokenizer, pairs, steps=sft_steps, seed=trainer.config.run.seed)
        trainer.sync_weights()
        report.baselines["sft_control/accuracy"] = trainer.evaluate()["eval/accuracy"]
    finally:
        trainer.model.load_state_dict(policy)
        trainer.sync_weights()


def run_preflight(trainer, sft_control_rows: list[dict] | None = None, *, synced: bool = False) -> PreflightReport:
    """All the checks on `trainer` (its engine is started, and given the policy's weights unless `synced`);
    raises PreflightError, after logging the table, when a verifier's start-up check or the self-test fails."""
    cfg = trainer.config.check
    report = verifier_checks(trainer.rewards)
    trainer._ensure_engine()
    if not synced:
        trainer.sync_weights()
    if cfg.difficulty_prompts > 0:
        difficulty_probe(trainer, cfg.difficulty_prompts, cfg.difficulty_samples, report)
    baselines(trainer, sft_control_rows, cfg.sft_control_steps, report)
    for warning in report.warnings:
        logger.warning("preflight: %s", warning)
    logger.info("preflight:\n%s", report.text())
    return report


def verifier_checks(rewards) -> PreflightReport:
    """The checks of the verifiers alone (what a resumed run repeats): start-up, self-test, reward scale."""
    report = PreflightReport()
    verifier_startup(rewards, report)
    verifier_self_test(rewards, report)
    reward_scale_warnings(rewards, report)
    if report.self_test_failures:
        logger.error("preflight:\n%s", report.text())
        raise PreflightError("verifier self-test failed: " + "; ".join(report.self_test_failures))
    return report

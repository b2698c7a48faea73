"""Alarms for the failure modes that lose GRPO runs, checked on every step's metrics.

Windowed rules compare the mean of a metric over the last `window` steps with its mean over the `window`
steps before (needs 2·window steps of history):

- entropy_collapse: entropy fell by at least `entropy_drop` (relative) while the fraction of stuck groups
  (all rewards equal and below the full reward) rose by at least `zero_var_rise` and the train reward did
  not rise by `reward_rise`: groups become identical without getting right, advantages vanish. (A policy
  that learns its task also loses entropy, but its identical groups are all-correct ones.)
- length_inflation: mean and p95 completion length both rose by at least `length_rise` (relative) while
  reward per generated token did not rise: longer, not better.
- reward_hacking: the train reward rose by at least `reward_rise` while held-out accuracy fell between the
  last two evaluations (a plateau is not evidence: a learning run's held-out accuracy stays put between two
  evaluations often, the demo's included); or one verifier's mean rose by `reward_rise` while another's fell
  by as much.
- off_policy_drift: over the last `window` steps, the clipped fraction is above `clip_ratio_max` or the
  rollout/trainer logprob mismatch above `mismatch_max`.
- collapse (at evaluations): held-out accuracy fell at least `collapse_drop` below its best; the alarm
  names the last checkpoint saved at or before the best evaluation.

A rule that fired stays quiet for `window` steps. Each alarm is a log line with the numbers that fired it
and the usual remedies, a `health/<name>` metric (1 on the step it fires), and an entry of `alarms`.

Every step also gets the rules' readings, the numbers they compare with their thresholds, as metrics
`health/reading/<name>` (READINGS), so a run shows how near each alarm came: a healthy run and a provoked one
can be told apart by their margins, not by a hair.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from grpo_fast.config_fields import option

logger = logging.getLogger(__name__)

REMEDIES = {
    "entropy_collapse": "lower the learning rate, add an entropy bonus (loss.entropy_coef), raise epsilon_high "
    "(clip-higher), or filter prompts whose groups never vary",
    "length_inflation": "add overlong shaping (grpo.overlong_buffer) or a length penalty, use a token-level loss "
    "(dapo, dr_grpo), and check that no verifier pays for length",
    "reward_hacking": "read the audit samples of the rising verifier, run its self-test with adversarial samples, "
    "and lower the weight of format-style rewards",
    "off_policy_drift": "lower the learning rate or num_iterations, turn on importance-sampling correction "
    "(grpo.vllm_importance_sampling_correction), and check that the engine's weights are synced every step",
    "collapse": "resume from the named checkpoint with a lower learning rate, or stop the run",
}


READINGS = {
    "entropy_fall": "entropy_collapse: relative fall of the entropy, last window against the one before",
    "stuck_rise": "entropy_collapse: rise of the share of stuck groups (equal rewards, not all right)",
    "reward_rise": "entropy_collapse / reward_hacking: rise of the train reward",
    "heldout_change": "reward_hacking: change of held-out accuracy between the last two evaluations",
    "length_rise": "length_inflation: the smaller of the relative rises of mean and p95 completion length",
    "reward_per_token_change": "length_inflation: change of the reward per generated token",
    "verifier_split": "reward_hacking: the smaller of the largest rise and the largest fall among the verifiers",
    "clip_ratio": "off_policy_drift: clipped fraction of tokens over the last window",
    "mismatch": "off_policy_drift: rollout/trainer logprob mismatch over the last window (nats per token)",
    "accuracy_drop": "collapse: held-out accuracy below its best (at evaluations)",
}
"""The numbers the rules compare with their thresholds, each step where they can be computed."""


@dataclass(frozen=True)
class Alarm:
    """An alarm that fired: its step, rule, message, and the rule's readings then (READINGS)."""

    step: int
    name: str
    message: str
    readings: dict = field(default_factory=dict)

    def line(self) -> str:
        return f"[health] step {self.step}: {self.name}: {self.message}. Remedies: {REMEDIES[self.name]}."


ALARMS = tuple(REMEDIES)


@dataclass
class HealthThresholds:
    """The rules' thresholds (module doc)."""

    window: int = option(10, "steps per window of the windowed rules (they need 2 x window steps)", low=1)
    entropy_drop: float = option(0.25, "entropy_collapse: relative fall of the entropy", low=0)
    zero_var_rise: float = option(0.2, "entropy_collapse: absolute rise of the share of stuck groups", low=0)
    length_rise: float = option(0.3, "length_inflation: relative rise of mean and p95 completion length", low=0)
    reward_rise: float = option(0.1, "reward_hacking / entropy_collapse: absolute rise of a reward", low=0)
    clip_ratio_max: float = option(0.2, "off_policy_drift: clipped fraction of tokens above this", low=0)
    mismatch_max: float = option(0.05, "off_policy_drift: rollout/trainer logprob mismatch (nats per token)", low=0)
    collapse_drop: float = option(0.2, "collapse: absolute fall of held-out accuracy below its best", low=0)


class HealthMonitor:
    """Feeds on each step's metrics (`observe`) and each evaluation (`observe_eval`); returns new alarms.
    `readings` holds the rules' readings of the last step observed (READINGS)."""

    def __init__(self, thresholds: HealthThresholds, reward_names: list[str]) -> None:
        self.t, self.reward_names = thresholds, reward_names
        self.history: list[dict] = []
        self.evals: list[tuple[int, float]] = []
        self.alarms: list[Alarm] = []
        self.readings: dict[str, float] = {}
        self._quiet_until: dict[str, int] = {}

    def observe(self, step: int, metrics: dict) -> list[Alarm]:
        self.history.append(metrics)
        self.readings = {}
        fired = [
            self._entropy_collapse(step),
            self._length_inflation(step),
            self._reward_hacking(step),
            self._off_policy_drift(step),
        ]
        return self._emit([a for a in fired if a is not None])

    def observe_eval(self, step: int, accuracy: float, checkpoint_steps: list[int]) -> list[Alarm]:
        self.evals.append((step, accuracy))
        best_step, best = max(self.evals, key=lambda e: (e[1], -e[0]))
        self.readings["accuracy_drop"] = best - accuracy
        if best - accuracy < self.t.collapse_drop:
            return []
        good = [s for s in checkpoint_steps if s <= best_step]
        where = (
            f"the last good checkpoint is step-{max(good):06d}"
            if good
            else (f"no checkpoint was saved at or before step {best_step} (set run.save_every)")
        )
        message = (
            f"held-out accuracy {accuracy:.3f} is {best - accuracy:.3f} below its best, {best:.3f} at step "
            f"{best_step}; {where}"
        )
        return self._emit([Alarm(step, "collapse", message, {"accuracy_drop": best - accuracy})])

    def _emit(self, alarms: list[Alarm]) -> list[Alarm]:
        out = []
        for alarm in alarms:
            if alarm.step < self._quiet_until.get(alarm.name, -1):
                continue
            self._quiet_until[alarm.name] = alarm.step + self.t.window
            logger.warning(alarm.line())
            self.alarms.append(alarm)
            out.append(alarm)
        return out

    def _read(self, **values: float) -> dict[str, float]:
        """Records readings of this step; returns them."""
        self.readings.update(values)
        return values

    # -- rules ------------------------------------------------------------------------------------------

    def _windows(self, key: str) -> tuple[float, float] | None:
        """(mean over the previous window, mean over the last window) of `key`, or None without enough data."""
        w = self.t.window
        values = [m.get(key) for m in self.history[-2 * w :]]
        if len(values) < 2 * w or any(v is None or not math.isfinite(v) for v in values):
            return None
        return float(np.mean(values[:w])), float(np.mean(values[w:]))

    def _entropy_collapse(self, step: int) -> Alarm | None:
        entropy, zero_var = self._windows("entropy"), self._windows("frac_stuck_groups")
        reward = self._windows("reward/mean")
        if entropy is None or zero_var is None or reward is None or entropy[0] <= 0:
            return None
        fell = 1 - entropy[1] / entropy[0]
        rose = zero_var[1] - zero_var[0]
        read = self._read(entropy_fall=fell, stuck_rise=rose, reward_rise=reward[1] - reward[0])
        if fell >= self.t.entropy_drop and rose >= self.t.zero_var_rise and reward[1] - reward[0] < self.t.reward_rise:
            return Alarm(
                step,
                "entropy_collapse",
                f"entropy {entropy[0]:.3f} -> {entropy[1]:.3f} (-{fell:.0%}) while stuck groups (equal rewards, not "
                f"all right) {zero_var[0]:.2f} -> {zero_var[1]:.2f} and the train reward {reward[0]:.3f} -> "
                f"{reward[1]:.3f}",
                read,
            )
        return None

    def _length_inflation(self, step: int) -> Alarm | None:
        mean, p95 = self._windows("completion/length_mean"), self._windows("completion/length_p95")
        reward = self._windows("reward/mean")
        if mean is None or p95 is None or reward is None or min(mean[0], p95[0]) <= 0:
            return None
        per_token = (reward[0] / mean[0], reward[1] / mean[1])
        read = self._read(
            length_rise=min(mean[1] / mean[0], p95[1] / p95[0]) - 1,
            reward_per_token_change=per_token[1] - per_token[0],
        )
        if mean[1] >= mean[0] * (1 + self.t.length_rise) and p95[1] >= p95[0] * (1 + self.t.length_rise):
            if per_token[1] <= per_token[0]:
                buckets = self.history[-1].get("completion/reward_by_length_quartile", "")
                return Alarm(
                    step,
                    "length_inflation",
                    f"mean length {mean[0]:.1f} -> {mean[1]:.1f}, p95 {p95[0]:.1f} -> {p95[1]:.1f}, reward per "
                    f"token {per_token[0]:.4f} -> {per_token[1]:.4f}; reward by length quartile {buckets}",
                    read,
                )
        return None

    def _reward_hacking(self, step: int) -> Alarm | None:
        """One alarm with every piece of evidence that holds (the train/held-out gap, the verifiers that part)."""
        evidence = []
        reward = self._windows("reward/mean")
        if reward is not None:
            self._read(reward_rise=reward[1] - reward[0])
        if reward is not None and len(self.evals) >= 2:
            self._read(heldout_change=self.evals[-1][1] - self.evals[-2][1])
        if reward is not None and reward[1] - reward[0] >= self.t.reward_rise and len(self.evals) >= 2:
            (_, before), (_, after) = self.evals[-2:]
            if after < before:
                evidence.append(
                    f"train reward {reward[0]:.3f} -> {reward[1]:.3f} while held-out accuracy {before:.3f} -> "
                    f"{after:.3f}"
                )
        changes = {}
        for name in self.reward_names:
            pair = self._windows(f"reward/{name}/mean")
            if pair is not None:
                changes[name] = pair[1] - pair[0]
        if len(changes) >= 2:
            self._read(verifier_split=min(max(changes.values()), -min(changes.values())))
        rising = [n for n, d in changes.items() if d >= self.t.reward_rise]
        falling = [n for n, d in changes.items() if d <= -self.t.reward_rise]
        if rising and falling:
            detail = ", ".join(f"{n} {changes[n]:+.3f}" for n in rising + falling)
            evidence.append(f"one verifier rises while another falls: {detail}")
        read = {k: v for k, v in self.readings.items() if k in ("reward_rise", "heldout_change", "verifier_split")}
        return Alarm(step, "reward_hacking", "; ".join(evidence), read) if evidence else None

    def _off_policy_drift(self, step: int) -> Alarm | None:
        recent = self.history[-self.t.window :]
        clip = [m["clip_ratio/region_mean"] for m in recent if "clip_ratio/region_mean" in m]
        mismatch = [m["mismatch/abs_logprob_diff_mean"] for m in recent if "mismatch/abs_logprob_diff_mean" in m]
        clip_mean = float(np.mean(clip)) if clip else 0.0
        mismatch_mean = float(np.mean(mismatch)) if mismatch else 0.0
        read = self._read(clip_ratio=clip_mean, mismatch=mismatch_mean)
        if clip_mean > self.t.clip_ratio_max or mismatch_mean > self.t.mismatch_max:
            return Alarm(
                step,
                "off_policy_drift",
                f"clipped fraction {clip_mean:.3f} (max {self.t.clip_ratio_max}), rollout/trainer logprob "
                f"mismatch {mismatch_mean:.4f} (max {self.t.mismatch_max}) over the last {len(recent)} steps",
                read,
            )
        return None


def margins(readings: dict[str, float], t: HealthThresholds) -> dict[str, tuple[float, bool]]:
    """Per alarm whose readings are there: (its main reading over its threshold, whether its other conditions
    hold). The rule fires when the ratio reaches 1 (off_policy_drift: exceeds it) and the other conditions hold,
    so the ratio says how near a run came, or how far beyond it went.

    entropy_collapse: entropy_fall / entropy_drop, if stuck_rise >= zero_var_rise and reward_rise < reward_rise.
    length_inflation: length_rise / length_rise (the thresholds of HealthThresholds), if reward_per_token_change <= 0.
    reward_hacking: the larger of verifier_split / reward_rise and, if heldout_change < 0, reward_rise /
    reward_rise. off_policy_drift: the larger of clip_ratio / clip_ratio_max and mismatch / mismatch_max.
    collapse: accuracy_drop / collapse_drop."""
    r, out, over = readings, {}, _over
    if {"entropy_fall", "stuck_rise", "reward_rise"} <= r.keys():
        out["entropy_collapse"] = (
            over(r["entropy_fall"], t.entropy_drop),
            r["stuck_rise"] >= t.zero_var_rise and r["reward_rise"] < t.reward_rise,
        )
    if {"length_rise", "reward_per_token_change"} <= r.keys():
        out["length_inflation"] = (over(r["length_rise"], t.length_rise), r["reward_per_token_change"] <= 0)
    hacking = [over(r["verifier_split"], t.reward_rise)] if "verifier_split" in r else []
    if "reward_rise" in r and "heldout_change" in r and r["heldout_change"] < 0:
        hacking.append(over(r["reward_rise"], t.reward_rise))
    if hacking:
        out["reward_hacking"] = (max(hacking), True)
    if "clip_ratio" in r:
        drift = max(over(r["clip_ratio"], t.clip_ratio_max), over(r["mismatch"], t.mismatch_max))
        out["off_policy_drift"] = (drift, True)
    if "accuracy_drop" in r:
        out["collapse"] = (over(r["accuracy_drop"], t.collapse_drop), True)
    return out


def _over(reading: float, threshold: float) -> float:
    """reading / threshold; a threshold of 0 gives inf for a positive reading, else 0."""
    if threshold > 0:
        return reading / threshold
    return math.inf if reading > 0 else 0.0


def reward_by_length(lengths: list[int], rewards: list[float], buckets: int = 4) -> str:
    """Mean reward per length quartile of one step's completions, as text: "[2-5] 0.31 | [6-9] 0.20 ..."."""
    pairs = sorted((n, r) for n, r in zip(lengths, rewards, strict=True) if math.isfinite(r))
    if not pairs:
        return ""
    parts = []
    for chunk in np.array_split(np.arange(len(pairs)), min(buckets, len(pairs))):
        group = [pairs[i] for i in chunk]
        parts.append(f"[{group[0][0]}-{group[-1][0]}] {np.mean([r for _, r in group]):.3f}")
    return " | ".join(parts)

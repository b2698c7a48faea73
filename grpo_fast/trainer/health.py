"""Alarms for the failure modes that lose GRPO runs, checked on every step's metrics.

Windowed rules compare the mean of a metric over the last `window` steps with its mean over the `window`
steps before (needs 2·window steps of history). With partial or asynchronous rollouts a run's first
`fill_steps` steps (rollout.max_staleness) are left out of every window: while the pipeline fills, a step trains
only the completions that finished first, the short ones (a long-tail task's first steps train completions of 5
tokens where its later ones average 50), so their lengths, rewards and entropies are not the policy's.

- entropy_collapse: entropy fell by at least `entropy_drop` (relative) while the fraction of stuck groups
  (all rewards equal and below the full reward) rose by at least `zero_var_rise` and the train reward did
  not rise by `reward_rise`: groups become identical without getting right, advantages vanish. (A policy
  that learns its task also loses entropy, but its identical groups are all-correct ones.) The last window
  is compared with three earlier ones: the window before it, the run's first window, and the window of the
  run's best train reward so far, so that a collapse spread over many windows, too slow to cross the
  thresholds from one window to the next, fires once its whole fall since the start or the best does.
- length_inflation: mean and p95 completion length both rose by at least `length_rise` (relative) while
  reward per generated token did not rise: longer, not better. The last window is compared with the window before
  and with the run's start (its first step; after a fill, its first window after it), so that a length paid for
  and learned within the run's first window fires too. Not while no_signal's conditions hold: there no reward pays
  for anything, and a length that drifts is a symptom of the missing signal.
- no_signal: over the last window, at least `stuck_max` of the groups were stuck (every sample of a prompt scored
  the same, below the full reward) and the train reward had not risen by `reward_rise` since the run's first
  window: the advantages are 0, so the rewards teach nothing and the weights move by the optimizer's momentum and
  the KL and entropy terms alone. A cold start that answers none of the prompts trains like this for as long as it
  runs, and no other rule sees it (its entropy need not fall); a policy that collapsed to one answer per prompt
  gets here too, beside entropy_collapse or collapse. (Groups stuck after the reward rose are a policy that
  saturated its rewards, hackable ones included: reward_hacking's business.)
- reward_hacking: the train reward rose by at least `reward_rise` while held-out accuracy fell between the
  last two evaluations by more than `heldout_sigmas` standard errors of that difference (a plateau, or a fall
  of a prompt or two, is no evidence: on 200 prompts one prompt is 0.005 of accuracy, and a learning run's
  held-out accuracy moves by that much between evaluations); or one verifier's mean rose by `reward_rise`
  while another's fell by as much, over the last window against the window before or the run's start.
- off_policy_drift: over the last `window` steps, the clipped fraction is above `clip_ratio_max` or the
  rollout/trainer logprob mismatch above `mismatch_max`. With partial or asynchronous rollouts the mismatch
  read is that of the fresh tokens (sampled by the weights being trained, staleness 0): older tokens differ
  by the staleness the mode intends (and corrects), not by a drift. With truncated sampling (top_p < 1,
  top_k) the engine's logprobs are renormalised over what it keeps, so the mismatch carries -log of the kept
  mass by design: the rule then reads the clipped fraction only. It needs a whole window.
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
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

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
    "off_policy_drift": "check that the engine's weights are synced every step, lower the learning rate or "
    "num_iterations, and turn on importance-sampling correction (grpo.vllm_importance_sampling_correction) where "
    "it is off",
    "no_signal": "if the run started like this: give the policy a start that solves some prompts (more or better "
    "cold-start SFT), train on prompts it solves sometimes (a pass rate between 10% and 90%: the preflight's "
    "difficulty probe measures it), sample more completions per prompt (rollout.num_generations), or give partial "
    "credit; if it got here from a working start, the policy collapsed to one answer per prompt: see "
    "entropy_collapse and collapse",
    "collapse": "take the best held-out model, or resume from the named checkpoint with a lower learning rate, or "
    "stop the run",
}


READINGS = {
    "entropy_fall": "entropy_collapse: relative fall of the entropy, last window against the earlier window nearest "
    "to firing (the one before, the run's first, the best train reward's)",
    "stuck_rise": "entropy_collapse: rise of the share of stuck groups (equal rewards, not all right) since that "
    "window",
    "reward_rise_since": "entropy_collapse: rise of the train reward since that window",
    "reward_rise": "reward_hacking: rise of the train reward, last window against the one before",
    "heldout_change": "reward_hacking: change of held-out accuracy between the last two evaluations",
    "heldout_sigmas": "reward_hacking: that change in standard errors of the difference",
    "length_rise": "length_inflation: the smaller of the relative rises of mean and p95 completion length, last window "
    "against the reference nearest to firing (the window before, the run's start)",
    "reward_per_token_change": "length_inflation: change of the reward per generated token since that reference",
    "stuck_share": "no_signal (and length_inflation's condition): share of stuck groups (equal rewards, not all "
    "right) over the last window",
    "reward_change_from_first": "no_signal: change of the train reward, last window against the run's first",
    "verifier_split": "reward_hacking: the smaller of the largest rise and the largest fall among the verifiers, "
    "last window against the window before or the run's start, whichever is larger",
    "clip_ratio": "off_policy_drift: clipped fraction of tokens over the last window",
    "mismatch": "off_policy_drift: rollout/trainer logprob mismatch over the last window (nats per token; partial "
    "and async rollouts: of the fresh tokens)",
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
    heldout_sigmas: float = option(
        3.0, "reward_hacking: a fall of held-out accuracy counts beyond this many standard errors of the change", low=0
    )
    clip_ratio_max: float = option(0.2, "off_policy_drift: clipped fraction of tokens above this", low=0)
    mismatch_max: float = option(0.05, "off_policy_drift: rollout/trainer logprob mismatch (nats per token)", low=0)
    stuck_max: float = option(
        0.9, "no_signal: share of stuck groups (equal rewards, not all right) over a window", low=0, high=1
    )
    collapse_drop: float = option(0.2, "collapse: absolute fall of held-out accuracy below its best", low=0)


class WindowMeans(NamedTuple):
    """The means of the entropy_collapse rule's metrics over the `window` steps ending at step `last`."""

    first: int
    last: int
    entropy: float
    stuck: float
    reward: float


class HealthMonitor:
    """Feeds on each step's metrics (`observe`) and each evaluation (`observe_eval`); returns new alarms.
    `readings` holds the rules' readings of the last step observed (READINGS); `fill_steps`: the steps the windowed
    rules leave out at the start (module doc)."""

    def __init__(
        self, thresholds: HealthThresholds, reward_names: list[str], fill_steps: int = 0, truncated: bool = False
    ) -> None:
        """truncated: the engine samples from a truncated distribution (top_p < 1, top_k), whose renormalised
        logprobs differ from the trainer's full-vocabulary ones by design (-log of the kept mass): off_policy_drift
        then reads the clipped fraction only."""
        self.t, self.reward_names, self.fill_steps, self.truncated = thresholds, reward_names, fill_steps, truncated
        self.history: list[dict] = []
        self.evals: list[tuple[int, float, int]] = []  # (step, accuracy, prompts evaluated)
        self.alarms: list[Alarm] = []
        self.readings: dict[str, float] = {}
        self._quiet_until: dict[str, int] = {}
        self._first_window: WindowMeans | None = None
        self._best_window: WindowMeans | None = None  # the window of the highest train reward so far
        self._start_step = 0  # the step of the first metrics observed
        self.named_checkpoints: set[int] = set()  # the steps whose checkpoint an alarm named: to keep
        # a verifier's mean is missing (NaN) at a step where it scored no row (routed by `when:`)
        self._gappy = {f"reward/{name}/mean" for name in reward_names}

    def state_dict(self) -> dict:
        """What the rules remember, as plain data (a checkpoint's): the steps' metrics and the evaluations, the
        alarms and their cool-downs, the first and best windows, the checkpoints named."""
        return {
            "history": self.history,
            "evals": [list(e) for e in self.evals],
            "alarms": [asdict(a) for a in self.alarms],
            "quiet_until": dict(self._quiet_until),
            "windows": [None if w is None else list(w) for w in (self._first_window, self._best_window)],
            "start_step": self._start_step,
            "named_checkpoints": sorted(self.named_checkpoints),
        }

    def load_state_dict(self, state: dict) -> None:
        """A resumed run's memory of the steps before it (`state_dict`)."""
        self.history = list(state["history"])
        self.evals = [tuple(e) for e in state["evals"]]
        self.alarms = [Alarm(**a) for a in state["alarms"]]
        self._quiet_until = dict(state["quiet_until"])
        self._first_window, self._best_window = (None if w is None else WindowMeans(*w) for w in state["windows"])
        self._start_step = state["start_step"]
        self.named_checkpoints = set(state["named_checkpoints"])

    def observe(self, step: int, metrics: dict) -> list[Alarm]:
        if not self.history:
            self._start_step = step
        self.history.append(metrics)
        self.readings = {}
        signal = self._signal_readings()  # no_signal's, also length_inflation's condition
        fired = [
            self._entropy_collapse(step),
            self._length_inflation(step, signal),
            self._reward_hacking(step),
            self._off_policy_drift(step),
            self._no_signal(step, signal),
        ]
        return self._emit([a for a in fired if a is not None])

    def observe_eval(
        self, step: int, accuracy: float, checkpoint_steps: list[int], *, prompts: int, best_model: str | None = None
    ) -> list[Alarm]:
        """A held-out evaluation at `step`: `accuracy` over `prompts` prompts; `checkpoint_steps`: the steps saved so
        far; `best_model`: where the model of the best evaluation is kept (named by the collapse alarm)."""
        self.evals.append((step, accuracy, prompts))
        best_step, best, _ = max(self.evals, key=lambda e: (e[1], -e[0]))
        self.readings["accuracy_drop"] = best - accuracy
        if best - accuracy < self.t.collapse_drop:
            return []
        good = [s for s in checkpoint_steps if s <= best_step]
        self.named_checkpoints.update(good[-1:])
        where = (
            f"the last good checkpoint is step-{max(good):06d}"
            if good
            else (f"no checkpoint was saved at or before step {best_step} (set run.save_every)")
        )
        if best_model is not None:
            where += f"; the best held-out model (step {best_step}) is in {best_model}"
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

    def _mean(self, key: str, end: int) -> float | None:
        """The mean of `key` over the `window` steps of the history ending before index `end` (negative: from the
        end), or None where the window reaches into the fill or lacks finite values: any for most keys, more than
        half for a verifier's mean (a step where it scored no row has none)."""
        w, n = self.t.window, len(self.history)
        stop = n + end if end <= 0 else end
        values = [m.get(key) for m in self.history[max(stop - w, 0) : stop]]
        finite = [v for v in values if v is not None and math.isfinite(v)]
        need = w // 2 + 1 if key in self._gappy else w
        if stop - w < self.fill_steps or len(values) < w or len(finite) < need:
            return None
        return float(np.mean(finite))

    def _windows(self, key: str) -> tuple[float, float] | None:
        """(mean over the previous window, mean over the last window) of `key`, or None without enough data."""
        previous, last = self._mean(key, -self.t.window), self._mean(key, 0)
        return None if previous is None or last is None else (previous, last)

    def _collapse_window(self, end: int) -> WindowMeans | None:
        """The entropy_collapse rule's means over the window ending before history index `end` (<= 0)."""
        means = [self._mean(key, end) for key in ("entropy", "frac_stuck_groups", "reward/mean")]
        if any(m is None for m in means):
            return None
        last = len(self.history) + end
        return WindowMeans(last - self.t.window + 1, last, *means)

    def _entropy_collapse(self, step: int) -> Alarm | None:
        """The last window against the one before, the run's first and its best train reward's (module doc);
        the readings are those of the comparison nearest to firing."""
        last = self._collapse_window(0)
        if last is None:
            return None
        earlier = {
            "the window before": self._collapse_window(-self.t.window),
            "the run's first window": self._first_window,
            "the window of the best train reward so far": self._best_window,
        }
        self._first_window = self._first_window or last
        if self._best_window is None or last.reward > self._best_window.reward:
            self._best_window = last
        comparisons = []
        for label, ref in earlier.items():
            if ref is None or ref.entropy <= 0 or ref.last >= last.first:
                continue  # not there yet, or overlapping the last window
            if any(ref.last == other[1].last for other in comparisons):
                continue  # the same window as one compared already
            fell, rose, rise = 1 - last.entropy / ref.entropy, last.stuck - ref.stuck, last.reward - ref.reward
            others = rose >= self.t.zero_var_rise and rise < self.t.reward_rise
            comparisons.append(((others, fell / max(self.t.entropy_drop, 1e-12)), ref, label, fell, rose, rise))
        if not comparisons:
            return None
        _, ref, label, fell, rose, rise = max(comparisons, key=lambda c: c[0])
        read = self._read(entropy_fall=fell, stuck_rise=rose, reward_rise_since=rise)
        if fell >= self.t.entropy_drop and rose >= self.t.zero_var_rise and rise < self.t.reward_rise:
            return Alarm(
                step,
                "entropy_collapse",
                f"entropy {ref.entropy:.3f} -> {last.entropy:.3f} (-{fell:.0%}) while stuck groups (equal rewards, not "
                f"all right) {ref.stuck:.2f} -> {last.stuck:.2f} and the train reward {ref.reward:.3f} -> "
                f"{last.reward:.3f}, steps {last.first}-{last.last} against {label} (steps {ref.first}-{ref.last})",
                read,
            )
        return None

    def _references(self, keys: tuple[str, ...]) -> dict[str, list[float]]:
        """The means of `keys` to compare the last window's with, by label: the window before, and the run's start
        (its first step: the completions of the policy it started from; after a fill, the mean of its first window
        after it, as one step's hand-out there is whatever groups happened to finish), each once it does not overlap
        the last window and has every key."""
        w, fill, refs = self.t.window, self.fill_steps, {}
        if not fill and len(self.history) > w:
            start = [self.history[0].get(k) for k in keys]
            if all(v is not None and math.isfinite(v) for v in start):
                refs[f"the run's start (step {self._start_step})"] = [float(v) for v in start]
        if fill and len(self.history) >= fill + 2 * w:
            start = [self._mean(k, fill + w) for k in keys]
            if None not in start:
                first = self._start_step + fill
                refs[f"the run's first window after the fill (steps {first}-{first + w - 1})"] = start
        before = [self._mean(k, -w) for k in keys]
        if None not in before:
            refs["the window before"] = before
        return refs

    def _length_inflation(self, step: int, signal: dict[str, float]) -> Alarm | None:
        """The last window against the window before and against the run's start, the comparison nearest to firing:
        a policy that learns to pay itself with length in a few steps does so inside the run's first window, where
        the window-to-window comparison alone cannot see it."""
        keys = ("completion/length_mean", "completion/length_p95", "reward/mean")
        last = [self._mean(k, 0) for k in keys]
        if None in last:
            return None
        comparisons = []
        for label, (mean, p95, reward) in self._references(keys).items():
            if min(mean, p95) <= 0:
                continue
            rise = min(last[0] / mean, last[1] / p95) - 1
            per_token = (reward / mean, last[2] / last[0])
            comparisons.append(((per_token[1] <= per_token[0], rise), label, mean, p95, rise, per_token))
        if not comparisons:
            return None
        (others, rise), label, mean, p95, _, per_token = max(comparisons, key=lambda c: c[0])
        read = self._read(length_rise=rise, reward_per_token_change=per_token[1] - per_token[0]) | signal
        if rise >= self.t.length_rise and others and not no_signal_holds(signal, self.t):
            buckets = self.history[-1].get("completion/reward_by_length_quartile", "")
            return Alarm(
                step,
                "length_inflation",
                f"mean length {mean:.1f} -> {last[0]:.1f}, p95 {p95:.1f} -> {last[1]:.1f}, reward per token "
                f"{per_token[0]:.4f} -> {per_token[1]:.4f} against {label}; reward by length quartile {buckets}",
                read,
            )
        return None

    def _signal_readings(self) -> dict[str, float]:
        """no_signal's readings (READINGS), recorded; empty before a window of steps with stuck shares."""
        stuck = self._mean("frac_stuck_groups", 0)
        first, last = self._mean("reward/mean", self.fill_steps + self.t.window), self._mean("reward/mean", 0)
        if stuck is None or first is None or last is None:
            return {}
        return self._read(stuck_share=stuck, reward_change_from_first=last - first)

    def _no_signal(self, step: int, read: dict[str, float]) -> Alarm | None:
        if not no_signal_holds(read, self.t):
            return None
        return Alarm(
            step,
            "no_signal",
            f"{read['stuck_share']:.0%} of the groups of the last {self.t.window} steps were stuck (every sample of a "
            f"prompt scored the same, below the full reward; train reward {self._mean('reward/mean', 0):.3f}, "
            f"{read['reward_change_from_first']:+.3f} since the run's first window): their advantages are 0 and the "
            "rewards teach nothing",
            read,
        )

    def _verifier_changes(self) -> dict[str, float]:
        """Each verifier's change of mean reward over the last window, against the window before or the run's start,
        whichever parts the verifiers more (the smaller of the largest rise and the largest fall)."""
        keys = tuple(f"reward/{name}/mean" for name in self.reward_names)
        last = [self._mean(k, 0) for k in keys]
        if len(keys) < 2 or None in last:
            return {}
        splits = []
        for ref in self._references(keys).values():
            changes = {name: now - then for name, now, then in zip(self.reward_names, last, ref, strict=True)}
            splits.append((min(max(changes.values()), -min(changes.values())), changes))
        return max(splits, key=lambda s: s[0])[1] if splits else {}

    def _reward_hacking(self, step: int) -> Alarm | None:
        """One alarm with every piece of evidence that holds (the train/held-out gap, the verifiers that part)."""
        evidence = []
        reward = self._windows("reward/mean")
        if reward is not None:
            self._read(reward_rise=reward[1] - reward[0])
        if reward is not None and len(self.evals) >= 2:
            (_, before, n_before), (_, after, n_after) = self.evals[-2:]
            sigmas = (after - before) / difference_stderr(before, n_before, after, n_after)
            self._read(heldout_change=after - before, heldout_sigmas=sigmas)
            if reward[1] - reward[0] >= self.t.reward_rise and sigmas <= -self.t.heldout_sigmas:
                evidence.append(
                    f"train reward {reward[0]:.3f} -> {reward[1]:.3f} while held-out accuracy {before:.3f} -> "
                    f"{after:.3f} ({-sigmas:.1f} standard errors on {n_after} prompts)"
                )
        changes = self._verifier_changes()
        if changes:
            self._read(verifier_split=min(max(changes.values()), -min(changes.values())))
        rising = [n for n, d in changes.items() if d >= self.t.reward_rise]
        falling = [n for n, d in changes.items() if d <= -self.t.reward_rise]
        if rising and falling:
            detail = ", ".join(f"{n} {changes[n]:+.3f}" for n in rising + falling)
            evidence.append(f"one verifier rises while another falls: {detail}")
        names = ("reward_rise", "heldout_change", "heldout_sigmas", "verifier_split")
        read = {k: v for k, v in self.readings.items() if k in names}
        return Alarm(step, "reward_hacking", "; ".join(evidence), read) if evidence else None

    def _off_policy_drift(self, step: int) -> Alarm | None:
        recent = self.history[-self.t.window :]
        if len(recent) < self.t.window:  # a whole window, as the other windowed rules
            return None
        clip = [m["clip_ratio/region_mean"] for m in recent if "clip_ratio/region_mean" in m]
        mismatch = [v for v in map(drift_mismatch, recent) if v is not None and not self.truncated]
        clip_mean = float(np.mean(clip)) if clip else 0.0
        mismatch_mean = float(np.mean(mismatch)) if mismatch else 0.0
        read = self._read(clip_ratio=clip_mean, mismatch=mismatch_mean)
        if clip_mean > self.t.clip_ratio_max or mismatch_mean > self.t.mismatch_max:
            fresh = " of the fresh tokens (staleness 0)" if any(FRESH_MISMATCH in m for m in recent) else ""
            return Alarm(
                step,
                "off_policy_drift",
                f"clipped fraction {clip_mean:.3f} (max {self.t.clip_ratio_max}), rollout/trainer logprob "
                f"mismatch{fresh} {mismatch_mean:.4f} (max {self.t.mismatch_max}) over the last {len(recent)} steps",
                read,
            )
        return None


STALENESS_MISMATCH = "mismatch/abs_logprob_diff_staleness_"
FRESH_MISMATCH = STALENESS_MISMATCH + "0"


def drift_mismatch(metrics: dict) -> float | None:
    """The rollout/trainer logprob mismatch of a step that tells a drift: over all its tokens, or, where the step
    trained tokens of several weight versions (partial and async rollouts log the mismatch by staleness), over
    its fresh ones (None when it had none)."""
    if any(key.startswith(STALENESS_MISMATCH) for key in metrics):
        return metrics.get(FRESH_MISMATCH)
    return metrics.get("mismatch/abs_logprob_diff_mean")


def no_signal_holds(readings: dict[str, float], t: HealthThresholds) -> bool:
    """Whether no_signal's conditions hold on `readings` (READINGS; False without its two)."""
    return (
        {"stuck_share", "reward_change_from_first"} <= readings.keys()
        and readings["stuck_share"] >= t.stuck_max
        and readings["reward_change_from_first"] < t.reward_rise
    )


def difference_stderr(before: float, n_before: int, after: float, n_after: int) -> float:
    """The standard error of the difference of two accuracies measured on n_before and n_after prompts, each
    binomial with its rate smoothed towards 1/2 by one success and one failure ((k + 1) / (n + 2)), so that
    accuracies of 0 or 1 still have a spread."""
    variance = 0.0
    for accuracy, n in ((before, n_before), (after, n_after)):
        p = (accuracy * n + 1) / (n + 2)
        variance += p * (1 - p) / n
    return math.sqrt(variance)


def margins(readings: dict[str, float], t: HealthThresholds) -> dict[str, tuple[float, bool]]:
    """Per alarm whose readings are there: (its main reading over its threshold, whether its other conditions
    hold). The rule fires when the ratio reaches 1 (off_policy_drift: exceeds it) and the other conditions hold,
    so the ratio says how near a run came, or how far beyond it went.

    entropy_collapse: entropy_fall / entropy_drop, if stuck_rise >= zero_var_rise and reward_rise_since <
    reward_rise. length_inflation: length_rise / length_rise (the thresholds of HealthThresholds), if
    reward_per_token_change <= 0 and not no_signal_holds. no_signal: stuck_share / stuck_max, if
    reward_change_from_first < reward_rise. reward_hacking: the larger of verifier_split / reward_rise and, if
    heldout_sigmas <= -heldout_sigmas (a significant fall), reward_rise / reward_rise. off_policy_drift: the larger
    of clip_ratio / clip_ratio_max and mismatch / mismatch_max. collapse: accuracy_drop / collapse_drop."""
    r, out, over = readings, {}, _over
    if {"entropy_fall", "stuck_rise", "reward_rise_since"} <= r.keys():
        out["entropy_collapse"] = (
            over(r["entropy_fall"], t.entropy_drop),
            r["stuck_rise"] >= t.zero_var_rise and r["reward_rise_since"] < t.reward_rise,
        )
    if {"length_rise", "reward_per_token_change"} <= r.keys():
        out["length_inflation"] = (
            over(r["length_rise"], t.length_rise),
            r["reward_per_token_change"] <= 0 and not no_signal_holds(r, t),
        )
    if {"stuck_share", "reward_change_from_first"} <= r.keys():
        out["no_signal"] = (over(r["stuck_share"], t.stuck_max), r["reward_change_from_first"] < t.reward_rise)
    hacking = [over(r["verifier_split"], t.reward_rise)] if "verifier_split" in r else []
    if "reward_rise" in r and "heldout_sigmas" in r and r["heldout_sigmas"] <= -t.heldout_sigmas:
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

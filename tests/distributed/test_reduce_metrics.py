"""How the ranks' step metrics become the step's (grpo_fast.distributed.context.reduce_gathered), against the
numbers one process would log for the same completions."""

from __future__ import annotations

import pytest

from grpo_fast.distributed.context import reduce_gathered
from grpo_fast.trainer.trainer import PER_COMPLETION_METRICS, SUMMED_METRICS


def test_a_mean_over_completions_is_weighted_by_each_rank_s_count():
    """DAPO's dynamic sampling: rank 0 generated 6 completions (2 rewarded), rank 1 10 (5 rewarded). One process logs
    7/16; the plain mean of the ranks' means said 0.4167."""
    ranks = [
        {"reward/mean": 2 / 6, "rollout/generated_samples": 6.0, "loss": 0.5, "time/step": 2.0, "reward/std": 0.4},
        {"reward/mean": 5 / 10, "rollout/generated_samples": 10.0, "loss": 0.25, "time/step": 3.0, "reward/std": 0.5},
    ]
    out = reduce_gathered(ranks, sums=SUMMED_METRICS, maxes=("time/*",), weighted=PER_COMPLETION_METRICS)
    assert out["reward/mean"] == pytest.approx(7 / 16, rel=1e-12)
    assert out["rollout/generated_samples"] == 16.0 and out["loss"] == 0.75 and out["time/step"] == 3.0
    assert out["reward/std"] == pytest.approx(0.45, rel=1e-12)  # not a share: the ranks' mean


def test_keys_some_ranks_lack():
    ranks = [{"a": 1.0, "hist_0": 0.5, "log/x": 2.0}, {"a": 3.0, "hist_1": 1.0}]
    out = reduce_gathered(ranks, zero_filled=("hist_*",), present_only=("log/*",))
    assert out == {"a": 2.0, "hist_0": 0.25, "hist_1": 0.5, "log/x": 2.0}
    with pytest.raises(RuntimeError, match=r"the ranks logged different metrics this step: \['log/x'\]"):
        reduce_gathered(ranks, zero_filled=("hist_*",))

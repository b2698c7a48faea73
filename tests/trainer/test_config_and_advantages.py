"""Config tree validation, reward/advantage math, synthetic tasks."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from grpo_fast.data.tasks import countdown_dataset, modular_arithmetic_dataset
from grpo_fast.rewards.length import soft_overlong_penalty
from grpo_fast.rewards.reward_set import combine_rewards
from grpo_fast.rewards.tasks import countdown_reward, exact_match_reward
from grpo_fast.trainer.advantages import group_advantages
from grpo_fast.trainer.config import TrainConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize(
    "path", sorted(p for p in CONFIGS.glob("*.yaml") if not p.name.startswith(("sft_", "r1_"))), ids=lambda p: p.name
)
def test_shipped_configs_load(path):
    """Every GRPO config under configs/ (sft_*.yaml are SFTConfigs, loaded in tests/sft; r1_*.yaml pipelines,
    in tests/pipeline)."""
    assert isinstance(load_config(path), TrainConfig)


def test_overrides_and_errors(tmp_path):
    cfg = load_config(None, ["run.max_steps=7", "grpo.scale_rewards=none", "optim.lr=3e-4"])
    assert (cfg.run.max_steps, cfg.grpo.scale_rewards, cfg.optim.lr) == (7, "none", 3e-4)
    bad = {
        "run.nope=1": "unknown key",
        "grpo.scale_rewards=mean": "grpo.scale_rewards",
        "run.max_steps=many": "run.max_steps: expected int",
        "loss.loss_type=ppo": "loss.loss_type",
        "loss.epsilon_low=2": "loss.epsilon_low: expected a value in [0, 1)",
        "loss.temperature=0.5": "loss.temperature: set by rollout.temperature",
        "loss.max_completion_length=9": "loss.max_completion_length: set by rollout.max_completion_length",
        "rollout.engine=nope": "rollout.engine: expected 'auto', one of",
        "rollout.num_generations=1": "num_generations",
        "reward.weights=[1.0, 2.0]": "reward.weights",
    }
    for override, message in bad.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            load_config(None, [override])
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("loss:\n  epsilon_low: 0.1\nmodel: {path: x, colour: red}\n")
    with pytest.raises(ValueError, match=r"model: unknown key\(s\) \['colour'\]"):
        load_config(yaml_file)


def test_the_loss_section_is_the_loss_config_with_the_rollout_s_temperature_and_length():
    cfg = load_config(None, ["loss.loss_type=cispo", "loss.epsilon_high=4", "rollout.temperature=0.7"])
    loss = cfg.loss_config()
    assert (loss.loss_type, loss.epsilon_high, loss.epsilon_low) == ("cispo", 4.0, 0.2)  # 0.2: the loss's default
    assert (loss.temperature, loss.max_completion_length) == (0.7, cfg.rollout.max_completion_length)
    assert load_config(None, ["rollout.temperature=0"]).loss_config().temperature == 1.0  # greedy: no scaling


def test_group_advantages_scalings():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv, zero_var = group_advantages(r, 4, "none")
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]))
    assert zero_var.tolist() == [False, True]
    adv_g, _ = group_advantages(r, 4, "group")
    torch.testing.assert_close(adv_g[:4], adv[:4] / (r[:4].std() + 1e-4))
    adv_b, _ = group_advantages(r, 4, "batch")
    torch.testing.assert_close(adv_b, adv / (r.std() + 1e-4))


def test_combined_rewards_and_overlong_penalty():
    per_func = torch.tensor([[1.0, math.nan], [0.0, 1.0], [math.nan, math.nan]])
    # the unscorable row (every function None) stays NaN, as in TRL
    torch.testing.assert_close(
        combine_rewards(per_func, [1.0, 0.5]), torch.tensor([1.0, 0.5, math.nan]), equal_nan=True
    )
    assert [soft_overlong_penalty(n, 16, 4, 2.0) for n in (10, 12, 14, 16, 20)] == [0.0, 0.0, -1.0, -2.0, -2.0]


def test_synthetic_tasks_are_verifiable():
    rows = modular_arithmetic_dataset(50, seed=3, ops="+-*")
    assert exact_match_reward(None, [r["answer"] for r in rows], [r["answer"] for r in rows]) == [1.0] * 50
    held = modular_arithmetic_dataset(20, seed=4)
    train = modular_arithmetic_dataset(50, seed=5, exclude={r["prompt"] for r in held})
    assert not {r["prompt"] for r in held} & {r["prompt"] for r in train}
    upper = modular_arithmetic_dataset(30, seed=5, ops="+*", fixed_b=7, min_operand=500, max_operand=1000)
    assert all(500 <= int(r["prompt"][1:].split("+")[0].split("*")[0]) < 1000 for r in upper)
    assert modular_arithmetic_dataset(10, seed=5) == modular_arithmetic_dataset(10, seed=5, min_operand=0)
    cd = countdown_dataset(20, seed=0)
    cols = {"numbers": [r["numbers"] for r in cd], "target": [r["target"] for r in cd]}
    assert countdown_reward(None, [r["answer"] for r in cd], **cols) == [1.0] * 20
    wrong = ["1+1"] * 20  # uses the wrong numbers
    assert countdown_reward(None, wrong, **cols) == [0.0] * 20
    assert countdown_reward(None, ["__import__('os')"], [[1]], [1]) == [0.0]


def test_unscorable_completions_leave_the_baseline_and_get_zero_advantage():
    """TRL: a completion for which every reward function returned None is NaN, excluded from its group's
    mean / std (and the batch std), and gets advantage 0; a group with nothing scorable is zero-variance."""
    per_func = torch.tensor([[1.0], [0.0], [math.nan], [0.0], [math.nan], [math.nan], [math.nan], [math.nan]])
    r = combine_rewards(per_func)
    for scale in ("none", "group", "batch"):
        adv, zero_var = group_advantages(r, 4, scale)
        valid = torch.tensor([1.0, 0.0, 0.0])
        expected = valid - valid.mean()
        if scale != "none":
            expected = expected / (valid.std() + 1e-4)
        torch.testing.assert_close(adv, torch.cat([expected[:2], torch.zeros(1), expected[2:], torch.zeros(4)]))
        assert zero_var.tolist() == [False, True]

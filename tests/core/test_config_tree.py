"""Config fields carry their own type, default, bounds and help: checked on every assignment from Python and every
value from YAML, old spellings read with a warning, unknown attributes refused naming the key's new home, and the
reference of every key (`--help-config`, docs/config.md) generated from the fields."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_fast.config_fields import option
from grpo_fast.core.config_tree import help_text, iter_keys
from grpo_fast.trainer.config import TrainConfig, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_assigning_an_option_that_moved_raises_naming_its_new_home():
    cfg = TrainConfig()
    with pytest.raises(AttributeError, match="grpo.loss_type: no such option; it is loss.loss_type now"):
        cfg.grpo.loss_type = "dapo"
    with pytest.raises(AttributeError, match="rollout.gpu_memory_utilization: no such option; it is rollout.vllm"):
        cfg.rollout.gpu_memory_utilization = 0.5
    with pytest.raises(AttributeError, match=r"run.max_step: no such option; expected one of \[.*'max_steps'"):
        cfg.run.max_step = 3
    assert not hasattr(cfg.grpo, "loss_type")  # nothing was set


def test_assignments_are_checked_like_config_files():
    cfg = TrainConfig()
    cfg.run.max_steps = 7
    cfg.optim.lr = 1  # an int where a float is declared: stored as a float
    assert cfg.run.max_steps == 7 and cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    for section, name, value, message in (
        ("run", "max_steps", 0, "run.max_steps: expected a value >= 1, got 0"),
        ("optim", "lr", float("nan"), "optim.lr: expected a finite number"),
        ("rollout", "top_p", 1.5, r"rollout.top_p: expected a value in \(0, 1\], got 1.5"),
        ("grpo", "scale_rewards", "mean", "grpo.scale_rewards: expected one of"),
        ("run", "packing", "yes", "run.packing: expected bool or auto"),
        ("rollout", "stop", "\n", "rollout.stop: expected a list"),
    ):
        with pytest.raises(ValueError, match=message):
            setattr(getattr(cfg, section), name, value)
    with pytest.raises(ValueError, match="rollout.vllm.sleep_level: expected one of"):
        cfg.rollout.vllm.sleep_level = 3


def test_old_spellings_are_read_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="grpo_fast"):
        cfg = load_config(
            {
                "rollout": {"gpu_memory_utilization": 0.5, "dtype": "float32"},
                "grpo": {"is_correction": "token", "is_cap": 2.5},
                "run": {"packing": "false", "share_prompt": "auto"},
            }
        )
    assert cfg.rollout.vllm.gpu_memory_utilization == 0.5 and cfg.rollout.vllm.dtype == "float32"
    assert cfg.grpo.rollout_correction() == ("token_truncate", None, 2.5)
    assert cfg.run.packing is False and cfg.run.share_prompt == "auto"
    text = caplog.text
    assert "rollout.gpu_memory_utilization is the old spelling of rollout.vllm.gpu_memory_utilization" in text
    assert "grpo.is_correction / is_cap are the old spelling" in text and "run.packing: the string 'false'" in text
    with pytest.raises(ValueError, match="the old spelling of rollout.vllm.dtype; set only rollout.vllm.dtype"):
        load_config({"rollout": {"dtype": "float32", "vllm": {"dtype": "bfloat16"}}})


def test_every_leaf_key_has_help_and_the_reference_is_current():
    keys = list(iter_keys(TrainConfig))
    assert len(keys) > 100 and all(k.help for k in keys), [k.key for k in keys if not k.help]
    assert {k.key for k in keys} >= {"rollout.vllm.gpu_memory_utilization", "rollout.hf.batch_size", "loss.beta"}
    check = subprocess.run([sys.executable, "scripts/config_docs.py", "--check"], cwd=ROOT, capture_output=True)
    assert check.returncode == 0, check.stderr.decode()


def test_help_config_prints_every_key(capsys):
    from grpo_fast.cli import main

    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert out == help_text(TrainConfig)
    assert "run.micro_batch_tokens (int | null; >= 1; default null)" in out and "\n    tokens per packed" in out


def test_a_field_without_help_is_visible_and_bounds_come_from_the_field():
    @dataclasses.dataclass
    class Section:
        steps: int = option(3, "how many", low=1)

    (doc,) = iter_keys(Section)
    assert (doc.key, doc.type, doc.default, doc.constraint) == ("steps", "int", 3, ">= 1")

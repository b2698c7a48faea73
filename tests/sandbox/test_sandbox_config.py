"""The sandbox's settings are config fields: `reward.sandbox` is a section of the training config, checked where it
is read, and its old spelling (a backend name) is upgraded with a warning."""

from __future__ import annotations

import logging

import pytest

from grpo_fast.sandbox import SandboxConfig, SandboxLimits
from grpo_fast.trainer.config import load_config


def test_reward_sandbox_is_a_section_of_the_training_config():
    cfg = load_config({"reward": {"sandbox": {"backend": "remote", "url": "http://127.0.0.1:9", "retries": 0}}})
    assert cfg.reward.sandbox == SandboxConfig(backend="remote", url="http://127.0.0.1:9", retries=0)
    assert load_config({}).reward.sandbox == SandboxConfig()
    with pytest.raises(ValueError, match=r"reward.sandbox.backend: expected one of \('auto', 'namespaces'"):
        load_config({"reward": {"sandbox": {"backend": "docker"}}})
    with pytest.raises(ValueError, match=r"reward.sandbox: unknown key\(s\) \['memory'\]"):
        load_config({"reward": {"sandbox": {"memory": 1}}})
    with pytest.raises(ValueError, match="reward.sandbox.retries: expected a value >= 0"):
        load_config({"reward": {"sandbox": {"retries": -1}}})


def test_a_backend_name_is_the_old_spelling(caplog):
    with caplog.at_level(logging.WARNING, logger="grpo_fast"):
        cfg = load_config({"reward": {"sandbox": "bwrap"}})
    assert cfg.reward.sandbox == SandboxConfig(backend="bwrap")
    assert "reward.sandbox: bwrap is the old spelling of reward.sandbox.backend: bwrap" in caplog.text


def test_sandbox_options_are_checked_where_they_are_built(monkeypatch):
    monkeypatch.delenv("GRPO_FAST_SANDBOX_URL", raising=False)
    with pytest.raises(ValueError, match="url: the remote backend needs a URL"):
        SandboxConfig.of("remote")
    monkeypatch.setenv("GRPO_FAST_SANDBOX_URL", "http://127.0.0.1:9")
    assert SandboxConfig.of("remote").service_url == "http://127.0.0.1:9"
    with pytest.raises(ValueError, match="limits.wall_s: expected a value > 0, got 0"):
        SandboxLimits.of({"wall_s": 0})
    with pytest.raises(ValueError, match=r"limits: unknown key\(s\) \['wall'\]"):
        SandboxLimits.of({"wall": 1})
    with pytest.raises(ValueError, match="nproc: expected int, got str"):
        SandboxLimits(nproc="8")

"""backend="auto" skips a backend that fails to run or computes wrong numbers here (one warning), and
remembers its choice for the process."""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch

import grpo_fast.backends as backends
from grpo_fast.backends.chunked import TORCH_BACKEND, ChunkedBackend, TorchEpilogue


class _RaisingEpilogue(TorchEpilogue):
    def stats(self, z, targets):
        raise RuntimeError("kernel launch failed")


class _OffByOneEpilogue(TorchEpilogue):
    def stats(self, z, targets):
        logp, entropy, lse = super().stats(z, targets)
        return logp + 1.0, entropy, lse


@pytest.fixture
def fake_backends(monkeypatch):
    """Two broken backends placed first in "auto"'s order on CPU, and a fresh choice cache."""
    module = types.ModuleType("fake_backends")
    module.RAISING = ChunkedBackend("raising", _RaisingEpilogue(), 1 << 20, 1 << 20)
    module.WRONG = ChunkedBackend("wrong", _OffByOneEpilogue(), 1 << 20, 1 << 20)
    monkeypatch.setitem(sys.modules, "fake_backends", module)
    backends.BACKENDS.register("raising", module.RAISING)
    backends.BACKENDS.register("wrong", module.WRONG)
    monkeypatch.setitem(backends.AUTO_ORDER, "cpu", ("raising", "wrong", "cpu", "torch"))
    monkeypatch.setattr(backends, "_AUTO_CHOICE", {})
    yield module
    for name in ("raising", "wrong"):
        backends.BACKENDS.unregister(name)


def test_auto_skips_failing_backends_once(fake_backends, caplog):
    with caplog.at_level(logging.WARNING, logger="grpo_fast.backends"):
        chosen = backends.get_backend("auto", torch.device("cpu"))
        again = backends.get_backend("auto", torch.device("cpu"))
    assert chosen is again
    assert chosen.name in ("cpu", "torch")  # "cpu" when the extension is built
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages  # one warning per broken backend, not one per call
    assert "'raising' failed its self-check" in messages[0] and "kernel launch failed" in messages[0]
    assert "'wrong' failed its self-check" in messages[1] and "logprobs differs" in messages[1]


def test_an_explicit_choice_is_not_second_guessed(fake_backends):
    assert backends.get_backend("wrong", torch.device("cpu")) is fake_backends.WRONG


def test_self_check_accepts_the_real_backends():
    for name in backends.available_backends(torch.device("cpu")):
        assert backends.self_check(backends.get_backend(name, torch.device("cpu")), torch.device("cpu")) is None
    assert backends.self_check(TORCH_BACKEND, torch.device("cpu")) is None


def test_a_registered_backend_is_checked_and_usable_by_name(monkeypatch):
    """register_backend checks the contract at once; the loss's backend option then takes the name."""
    from grpo_fast import GRPOLossConfig

    monkeypatch.setattr(backends, "AUTO_ORDER", dict(backends.AUTO_ORDER))
    monkeypatch.setattr(backends, "_AUTO_CHOICE", {})
    with pytest.raises(TypeError, match="missing .*forward_backward"):

        class Incomplete(ChunkedBackend):
            forward_backward = None

        backends.register_backend("incomplete", Incomplete("incomplete", TorchEpilogue(), 1 << 20, 1 << 20))
    mine = ChunkedBackend("mine", TorchEpilogue(), 1 << 20, 1 << 20, devices=("cpu",))
    backends.register_backend("mine", mine, auto_on=("cpu",))
    try:
        assert backends.AUTO_ORDER["cpu"][-2:] == ("mine", "torch")
        assert GRPOLossConfig(backend="mine").backend == "mine"
        assert backends.get_backend("mine", torch.device("cpu")) is mine
        with pytest.raises(ValueError, match="'mine' does not run on meta tensors"):
            backends.get_backend("mine", torch.device("meta"))
        with pytest.raises(ValueError, match="already registered"):
            backends.register_backend("mine", ChunkedBackend("mine", TorchEpilogue(), 1 << 20, 1 << 20))
    finally:
        backends.BACKENDS.unregister("mine")

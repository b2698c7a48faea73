"""The trust-region objectives (icepop, kpop, ipo, dppo_tv, dppo_kl, gmpo) train the demo's task end to end: the
modular-arithmetic prompts, the demo's exact-match reward and a format reward for answering in digits (varied from
the first step on, so the advantages are not all 0 for a model that starts from random weights), two updates per
batch (so the old policy differs from the current one in the second and the trust regions act). Slow: 30 steps per
objective on the torch and cpu backends and on triton under TRITON_INTERPRET=1 (whose layer 2 falls back to
PyTorch for these objectives), each with finite losses, no skipped update, and the format reward learned. In CI: two
steps per objective on the torch backend, one on cpu."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_trainer import tiny_trainer

from grpo_fast.backends import available_backends
from grpo_fast.loss import LOSS_TYPES
from grpo_fast.rewards.tasks import exact_match_reward

OBJECTIVES = ("icepop", "kpop", "ipo", "dppo_tv", "dppo_kl", "gmpo")


def digits(prompts, completions, **_):
    """The share of digits in a completion: the answer's format."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def _train(out: Path, name: str, backend: str, steps: int) -> list[dict]:
    if backend not in available_backends(torch.device("cpu")):
        pytest.skip(f"{backend} does not run here")
    overrides = [
        f"loss.loss_type={name}",
        f"loss.backend={backend}",
        f"run.max_steps={steps}",
        "rollout.num_generations=8",
        "rollout.max_completion_length=4",
        "run.prompts_per_step=4",
        "grpo.num_iterations=2",
        "optim.lr=3e-3",
        "run.save_every=0",
    ]
    trainer = tiny_trainer(out, *overrides, rewards=(exact_match_reward, digits))
    try:
        trainer.train()
    finally:
        trainer.close()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _check_trained(history: list[dict], name: str, steps: int) -> None:
    assert [h["step"] for h in history] == list(range(1, steps + 1))
    assert all(h["train/nonfinite"] == 0 and torch.isfinite(torch.tensor(h["loss"])) for h in history), history
    assert history[0]["grad_norm"] > 0  # (later steps may have learned the format: equal rewards, no gradient)
    if LOSS_TYPES[name].objective.masks_tokens:
        assert all(0 <= h["trust_region/masked_mean"] <= 1 for h in history)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "cpu", pytest.param("triton", marks=pytest.mark.triton)])
@pytest.mark.parametrize("name", OBJECTIVES)
def test_trains_the_demo_task_for_30_steps(tmp_path, name, backend):
    history = _train(tmp_path, name, backend, 30)
    _check_trained(history, name, 30)
    first, last = (sum(h["reward/digits/mean"] for h in part) / 5 for part in (history[:5], history[-5:]))
    assert last > first + 0.3, (first, last)


@pytest.mark.parametrize("name", OBJECTIVES)
def test_trains_a_few_steps(tmp_path, name):
    _check_trained(_train(tmp_path, name, "torch", 2), name, 2)


def test_trains_a_few_steps_on_the_cpu_backend(tmp_path):
    _check_trained(_train(tmp_path, "icepop", "cpu", 2), "icepop", 2)

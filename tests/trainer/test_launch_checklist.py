"""The launch checklist runs on every entry point: `GRPOTrainer.train()` called from Python runs it (a broken
verifier stops the run before its first step), a resumed run repeats the verifiers' checks, `health.preflight:
false` switches it off, and a checklist that already ran (`preflight()`, `grpo-fast check`) is not repeated."""

from __future__ import annotations

import socket

import pytest
from tiny_trainer import tiny_trainer

from grpo_fast.rewards.registry import reward
from grpo_fast.rewards.self_test import Sample
from grpo_fast.trainer.preflight import PreflightError

SAMPLES = [
    Sample("right", "4", {"answer": "4"}, True),
    Sample("every digit", "0 1 2 3 4 5 6 7 8 9", {"answer": "4"}, False),
]


@reward(kind="accuracy", range=(0.0, 1.0), samples=SAMPLES)
def contains_answer(prompts, completions, answer, **_):
    """A gameable verifier: it pays a completion that lists every digit."""
    return [float(str(a) in c) for c, a in zip(completions, answer, strict=True)]


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_train_from_python_refuses_a_gameable_verifier(tmp_path):
    trainer = tiny_trainer(tmp_path / "run", "run.max_steps=2", "check.difficulty_prompts=0")
    trainer.rewards.funcs[0] = contains_answer
    with pytest.raises(PreflightError, match="good sample 'right' scores 1.0, not above bad sample 'every digit'"):
        trainer.train()
    assert trainer.step == 0 and not (tmp_path / "run" / "checkpoints").exists()
    trainer.close()


def test_train_refuses_a_code_verifier_whose_sandbox_cannot_start(tmp_path):
    spec = {"name": "code_tests", "sandbox": {"backend": "remote", "url": _dead_url(), "retries": 0}}
    options = ("run.max_steps=1", "check.difficulty_prompts=0")
    trainer = tiny_trainer(tmp_path / "run", *options, rewards=[spec], columns={"tests": ["assert True"]})
    with pytest.raises(PreflightError, match="a verifier cannot work here: .*remote sandbox"):
        trainer.train()
    assert trainer.step == 0
    trainer.close()


def test_the_checklist_runs_once_and_can_be_switched_off(tmp_path):
    trainer = tiny_trainer(tmp_path / "a", "run.max_steps=1", "check.difficulty_prompts=2")
    trainer.train()
    report = trainer.preflight_report
    assert report.self_test and report.difficulty["prompts"] == 2  # the whole checklist, from train()
    trainer.close()

    off = tiny_trainer(tmp_path / "b", "run.max_steps=1", "health.preflight=false")
    off.rewards.funcs[0] = contains_answer  # would be refused
    off.train()
    assert off.preflight_report is None and off.step == 1
    off.close()

    ran = tiny_trainer(tmp_path / "c", "run.max_steps=1", "check.difficulty_prompts=2")
    first = ran.preflight()
    ran.train()
    assert ran.preflight_report is first  # not run a second time
    ran.close()


def test_a_resumed_run_checks_its_verifiers_again(tmp_path):
    out = tmp_path / "run"
    first = tiny_trainer(out, "run.max_steps=1", "health.preflight=false")
    first.train()
    first.close()
    resumed = tiny_trainer(out, "run.max_steps=2", "run.resume=true")
    resumed.train()
    report = resumed.preflight_report
    assert report.self_test and not report.self_test_failures and report.difficulty == {}  # the verifiers only
    resumed.close()

    gamed = tiny_trainer(out, "run.max_steps=3", "run.resume=true")
    gamed.rewards.funcs[0] = contains_answer
    with pytest.raises(PreflightError, match="verifier self-test failed"):
        gamed.train()
    assert gamed.step == 2  # the checkpoint's step: nothing trained
    gamed.close()

"""A shortened embedded demo with real vLLM rollouts must show a real held-out improvement from RL."""

from __future__ import annotations

import json

import pytest

from grpo_fast.demo.driver import DemoConfig, run_demo


def test_demo_rl_improves_heldout_accuracy(vllm_engine, tmp_path):
    cfg = DemoConfig(output_dir=str(tmp_path / "demo"), rl_steps=40, eval_every=20, progress=False)
    summary = run_demo(cfg, engine=vllm_engine)
    assert summary["rollout_engine"] == "vllm"
    assert summary["accuracy_after_rl"] - summary["accuracy_before_rl"] >= 0.30, summary
    on_disk = json.loads((tmp_path / "demo" / "summary.json").read_text())
    for key in (
        "accuracy_before_rl",
        "accuracy_after_rl",
        "steps",
        "seconds_total",
        "seconds_generate",
        "seconds_train",
        "seconds_sync",
        "rollout_engine",
    ):
        assert key in on_disk
    lines = (tmp_path / "demo" / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    assert last["step"] == 40 and last["mismatch/abs_logprob_diff_mean"] < 1e-4
    assert last["health/alarms_total"] == 0 and summary["alarms"] == []  # a healthy run raises no alarm
    assert not summary["preflight"]["self_test_failures"] and summary["preflight"]["difficulty"]["prompts"] == 16
    assert (tmp_path / "demo" / "plots" / "training_curves.png").stat().st_size > 0
    report = (tmp_path / "demo" / "report.md").read_text()
    assert "## Before the run" in report and "- none fired" in report and "training_curves.png" in report
    assert (tmp_path / "demo" / "report.html").stat().st_size > 0


@pytest.mark.slow
def test_full_demo_default_settings(vllm_engine, tmp_path):
    """The README's demo with its defaults (100 RL steps): >= 30 points of held-out accuracy from RL."""
    summary = run_demo(DemoConfig(output_dir=str(tmp_path / "demo"), progress=False), engine=vllm_engine)
    assert summary["accuracy_after_rl"] - summary["accuracy_before_rl"] >= 0.30, summary


@pytest.mark.slow
def test_code_demo_learns_through_the_pool_and_forged_programs_earn_nothing_extra(vllm_engine, tmp_path):
    """The code task: hidden tests in the sandbox, scored through the reward pool; a quarter of the
    completions replaced by answer-forging programs, each earning no more than its wrong function."""
    cfg = DemoConfig(
        output_dir=str(tmp_path / "code"), task="code", rl_steps=20, eval_every=10, forge_fraction=0.25, progress=False
    )
    summary = run_demo(cfg, engine=vllm_engine)
    assert summary["reward_after_rl"] - summary["reward_before_rl"] >= 0.1, summary
    assert summary["forged_completions"] > 100
    assert summary["forged_above_honest"] == 0 and summary["forged_gain_max"] <= 0, summary
    assert summary["forged_unscored"] == 0, summary


@pytest.mark.slow
def test_tools_demo_learns_to_call_the_tool(tmp_path):
    """The tool task with its defaults (300 SFT, 60 GRPO steps; transformers rollouts: the session's vLLM engine is
    the character tokenizer's model): >= 30 points of held-out accuracy from RL, by calling the tool."""
    cfg = DemoConfig(output_dir=str(tmp_path / "tools"), task="tools", engine="hf", progress=False)
    summary = run_demo(cfg)
    assert summary["accuracy_after_rl"] - summary["accuracy_before_rl"] >= 0.30, summary
    assert summary["tool_call_rate_after_rl"] > summary["tool_call_rate_before_rl"], summary

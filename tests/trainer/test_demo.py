"""The embedded demo with real vLLM rollouts learns its task on every seed and fires no alarm; the health alarms stay
silent on the recorded metrics of the demo's measured runs (benchmarks/results/demo_seeds_cpu.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_fast.demo.driver import DemoConfig, run_demo
from grpo_fast.trainer.health import HealthMonitor, HealthThresholds

RECORDED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "demo_seeds_cpu.json"


def test_demo_rl_improves_heldout_accuracy(vllm_engine, tmp_path):
    cfg = DemoConfig(output_dir=str(tmp_path / "demo"), eval_every=20, progress=False)
    summary = run_demo(cfg, engine=vllm_engine)
    assert summary["rollout_engine"] == "vllm"
    assert summary["accuracy_after_rl"] >= 0.9 and summary["accuracy_before_rl"] <= 0.2, summary
    assert summary["sft_final_loss"] < 0.4, summary  # the SFT reached the noisy teacher's distribution
    best = summary["best_heldout"]
    assert best["accuracy"] == max(a for _, a in summary["eval_accuracy_curve"]) and Path(best["model"]).is_dir()
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
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_the_demo_reaches_90_percent_on_every_seed_and_fires_no_alarm(vllm_engine, tmp_path, seed):
    """The README's demo with its defaults: held-out accuracy >= 0.9 after RL on seeds 0-4 (the 60-step constant-lr
    SFT left 28-100% by seed and CPU), and no alarm (reward_hacking fired on one prompt of 200 on seed 1)."""
    summary = run_demo(DemoConfig(output_dir=str(tmp_path / "demo"), seed=seed, progress=False), engine=vllm_engine)
    assert summary["accuracy_after_rl"] >= 0.9 and summary["alarms"] == [], summary


def _replay(metrics: list[dict], prompts: int) -> list:
    """The alarms the demo's recorded metrics give, fed to the monitor as the trainer feeds it."""
    monitor = HealthMonitor(HealthThresholds(), ["exact_match"])
    for row in metrics:
        if "reward/mean" in row:
            monitor.observe(row["step"], row)
        if "eval/accuracy" in row:
            monitor.observe_eval(row["step"], row["eval/accuracy"], [], prompts=prompts)
    return monitor.alarms


def test_the_alarms_stay_silent_on_the_recorded_demo_runs_of_every_seed():
    payload = json.loads(RECORDED.read_text())
    runs = [r for r in payload["runs"] if r.get("health_metrics")]
    assert {r["seed"] for r in runs} >= {0, 1, 2, 3, 4}
    for run in runs:
        which = (run["tree"], run["seed"])
        assert run["accuracy_after_rl"] >= 0.9, which
        assert [a.line() for a in _replay(run["health_metrics"], DemoConfig().num_eval)] == [], which


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

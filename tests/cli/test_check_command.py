"""`grpo-fast check` runs the checks before a run alone; `grpo-fast train` refuses a broken verifier."""

from __future__ import annotations

import json

import pytest

from grpo_fast.cli import main


def _args(command, tiny_dir, tmp_path, *extra):
    sets = [
        f"model.path={tiny_dir}",
        "rollout.engine=hf",
        "rollout.max_completion_length=3",
        "reward.workers=0",
        "check.difficulty_prompts=4",
        "check.difficulty_samples=4",
        "data.task_kwargs={n: 20}",
        f"run.output_dir={tmp_path}",
        *extra,
    ]
    return [command] + [item for s in sets for item in ("--set", s)]


def test_check_prints_the_self_test_and_the_difficulty_probe(tiny_dir, tmp_path, capsys):
    assert main(_args("check", tiny_dir, tmp_path)) == 0
    out = capsys.readouterr().out
    assert "verifier self-test:" in out and "exact_match_reward" in out
    assert "prompt difficulty (4 prompts x 4 samples)" in out


def test_train_refuses_to_start_with_a_verifier_that_fails_its_self_test(tiny_dir, tmp_path):
    broken = json.dumps([{"name": "think_format", "template": ".*"}])  # pays every completion alike
    with pytest.raises(SystemExit, match="the run would learn a broken reward, not starting: .*think_format"):
        main(_args("train", tiny_dir, tmp_path, f"reward.funcs={broken}", "run.max_steps=1"))
    assert not (tmp_path / "metrics.jsonl").exists()

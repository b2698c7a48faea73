"""The run's journals across a crash and a restart: a partly written last line of metrics.jsonl or
audit.jsonl (the process died mid-write) is dropped on resume; a fresh run never silently replaces an
earlier run's metrics and checkpoints (run.overwrite / --overwrite)."""

from __future__ import annotations

import json

import pytest
from tiny_trainer import tiny_trainer

from grpo_fast.cli import main
from grpo_fast.core import checkpoint as ckpt
from grpo_fast.core.metrics import MetricsLogger, read_jsonl
from grpo_fast.trainer.audit import AuditTrail


def _trainer(out, *overrides):
    return tiny_trainer(out, "health.audit_every=1", *overrides)


def _run(out, *overrides):
    trainer = _trainer(out, *overrides)
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


def _steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_truncated_last_line_of_the_journals_is_dropped_on_resume(tmp_path):
    out = tmp_path / "run"
    _run(out, "run.max_steps=1")
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "reward/me')  # killed while logging step 2
    with open(out / "audit.jsonl", "a") as f:
        f.write('{"step": 2, "rank": "to')
    _run(out, "run.max_steps=2", "run.resume=true")
    assert _steps(out / "metrics.jsonl") == [1, 2]
    assert sorted(set(_steps(out / "audit.jsonl"))) == [1, 2]


def test_a_corrupt_line_inside_a_journal_is_an_error_naming_the_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, oops\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not JSON"):
        read_jsonl(path)
    path.write_text('{"step": 1}\n{"step": 2, "tru')
    assert read_jsonl(path) == [{"step": 1}]
    assert MetricsLogger(tmp_path, tensorboard=False).history == [{"step": 1}]
    (tmp_path / "audit.jsonl").write_text('{"step": 1, "rank": "top"}\n{"st')
    assert AuditTrail(tmp_path).records == [{"step": 1, "rank": "top"}]


def test_a_fresh_run_refuses_an_output_dir_with_an_earlier_run(tmp_path):
    out = tmp_path / "run"
    _run(out, "run.max_steps=2")
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match=r"run.overwrite: true.*--overwrite"):
        _run(out, "run.max_steps=1")
    assert (out / "metrics.jsonl").read_text() == before  # untouched
    assert ckpt.saved_steps(out / "checkpoints") == [2]

    _run(out, "run.max_steps=1", "run.overwrite=true")
    assert _steps(out / "metrics.jsonl") == [1]
    assert ckpt.saved_steps(out / "checkpoints") == [1]  # a later --resume cannot pick the old run's step 2


def test_resume_without_a_checkpoint_refuses_to_replace_the_metrics(tmp_path):
    out = tmp_path / "run"
    _run(out, "run.max_steps=1", "run.save_final=false")
    with pytest.raises(ValueError, match="run.overwrite"):
        _run(out, "run.max_steps=1", "run.resume=true")


def test_the_cli_overwrite_flag_sets_run_overwrite(tmp_path, capsys):
    assert main(["train", "--overwrite", "--print-config", "--set", f"run.output_dir={tmp_path}"]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["overwrite"] is True
    assert main(["train", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["overwrite"] is False

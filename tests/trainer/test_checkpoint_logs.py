"""The run's journals across a crash and a restart: a partly written last line of metrics.jsonl or
audit.jsonl (the process died mid-write) is dropped on resume; a fresh run never silently replaces an
earlier run's metrics and checkpoints (run.overwrite / --overwrite); a resume without a checkpoint starts
again only over this same run's unsaved progress."""

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


def test_a_resume_drops_the_steps_after_its_checkpoint_from_the_audit_page_too(tmp_path):
    """The page kept showing the abandoned steps' completions after the journal dropped them."""
    trail = AuditTrail(tmp_path)
    record = {"rank": "top", "reward": 1.0, "rewards": {}, "length": 1, "prompt": "p"}
    trail.records = [{**record, "step": s, "completion": f"step {s}"} for s in (1, 2)]
    (tmp_path / "audit.html").write_text("<p>step 1</p><p>step 2</p>")
    trail.truncate_after(1)
    assert "step 1" in (tmp_path / "audit.html").read_text() and "step 2" not in (tmp_path / "audit.html").read_text()


def test_a_corrupt_line_inside_a_journal_is_an_error_naming_the_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, oops\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not JSON"):
        read_jsonl(path)
    path.write_text('{"step": 1}\n{"step": 2, "tru')
    assert read_jsonl(path) == [{"step": 1}]
    assert MetricsLogger(tmp_path).history == [{"step": 1}]
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


def test_resume_without_a_checkpoint_refuses_to_replace_a_finished_run(tmp_path):
    out = tmp_path / "run"
    _run(out, "run.max_steps=1", "run.save_final=false")
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match=r"run.resume: .* it finished \(report.md is there\).*run.overwrite"):
        _run(out, "run.max_steps=1", "run.save_final=false", "run.resume=true")
    assert (out / "metrics.jsonl").read_text() == before


def _unsaved_progress(out, *overrides):
    """A run killed before its first checkpoint: its signature and a logged step, no checkpoint, no report."""
    _run(out, "run.max_steps=1", "run.save_final=false", *overrides)
    (out / "report.md").unlink()
    assert ckpt.earlier_run_files(out) == ["metrics.jsonl"]


def test_resume_without_a_checkpoint_starts_this_runs_unsaved_progress_again(tmp_path, caplog):
    out = tmp_path / "run"
    _unsaved_progress(out)
    (out / "metrics.jsonl").write_text('{"step": 1, "from": "the killed run"}\n')
    _run(out, "run.max_steps=2", "run.save_final=false", "run.resume=true")  # max_steps: a harmless change
    assert _steps(out / "metrics.jsonl") == [1, 2]
    assert "the killed run" not in (out / "metrics.jsonl").read_text()  # replaced
    assert "started again from step 0 and replaced" in caplog.text


def test_resume_without_a_checkpoint_refuses_another_runs_progress(tmp_path):
    out = tmp_path / "run"
    _unsaved_progress(out, "optim.lr=1e-3")
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match=r"another run: optim.lr: saved 0.001, now 1e-06.*run.overwrite"):
        _run(out, "run.max_steps=1", "run.resume=true", "optim.lr=1e-6")
    (out / "train_config.json").unlink()  # a run from before the signature was written: not known to be this one
    with pytest.raises(ValueError, match=r"it has no train_config.json"):
        _run(out, "run.max_steps=1", "run.resume=true", "optim.lr=1e-3")
    assert (out / "metrics.jsonl").read_text() == before


def test_the_cli_overwrite_flag_sets_run_overwrite(tmp_path, capsys):
    assert main(["train", "--overwrite", "--print-config", "--set", f"run.output_dir={tmp_path}"]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["overwrite"] is True
    assert main(["train", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["overwrite"] is False

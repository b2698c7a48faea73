"""kill -9 at chosen points of a run (generation, scoring, the optimizer step, a checkpoint being written),
then `--resume`, until the run finishes: every step is logged exactly once, no partly written checkpoint is
ever resumed from, and the final weights and optimizer state equal an uninterrupted run's bit for bit (CPU,
transformers engine, one thread).

The runs are `grpo-fast train` subprocesses; the kills come from tests/trainer/kill_points.py (the engine and
reward named by import path; GRPO_TEST_KILL picks the point). Also here: a checkpoint directory left
incomplete (killed while copied or written outside the atomic writer) is skipped on resume."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from grpo_fast.core.checkpoint import TRAINER_STATE, latest_checkpoint, list_checkpoints, load_trainer_state
from grpo_fast.testing.configs import quiet_run_config
from grpo_fast.testing.train_cli import train_in_subprocess
from grpo_fast.testing.trees import assert_equal_trees

HERE = Path(__file__).parent
STEPS = 4


def _config(tmp_path: Path, model_dir: Path, steps: int = STEPS) -> Path:
    cfg = quiet_run_config(
        model_dir,
        reward={"funcs": ["kill_points:char_code_reward"], "workers": 0},
        rollout={"engine": "kill_points:KillingEngine", "num_generations": 4, "max_completion_length": 3},
        grpo={"num_iterations": 2},
        optim={"lr": 1e-2, "lr_scheduler": "linear", "warmup_steps": 1},
        run={"max_steps": steps, "prompts_per_step": 2, "micro_batch_size": 4},
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(
    config: Path, out: Path, kill: str | None = None, resume: bool = False, overrides=(), must_succeed=None
) -> tuple[int, str]:
    """`grpo-fast train` in a subprocess (killed at `kill`, "<phase>:<n>" of kill_points); (exit code, stderr).
    must_succeed (default: without `kill`): assert that it exits 0."""
    proc = train_in_subprocess(config, out, import_dir=HERE, kill=kill, resume=resume, overrides=overrides, timeout=300)
    if kill is None if must_succeed is None else must_succeed:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.returncode, proc.stderr


def _final_state(out: Path, steps: int) -> tuple[dict, dict]:
    last = latest_checkpoint(out / "checkpoints")
    assert last is not None and last.name == f"step-{steps:06d}"
    return load_file(last / "model.safetensors"), load_trainer_state(last)


def _train_in_process(config: Path, out: Path, monkeypatch, *overrides: str):
    """The uninterrupted run, in this process (as `grpo-fast train` builds it; one thread like the others)."""
    from grpo_fast.cli.train import trainer_from_config
    from grpo_fast.trainer import load_config

    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.delenv("GRPO_TEST_KILL", raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = trainer_from_config(load_config(config, [f"run.output_dir={out}", *overrides]))
        try:
            trainer.train()
        finally:
            trainer.close()
    finally:
        torch.set_num_threads(threads)
    return trainer


def _check_killed_run_matches(tmp_path, tiny_dir, monkeypatch, kills: list[str], steps: int = STEPS) -> None:
    config = _config(tmp_path, tiny_dir, steps)
    # The uninterrupted run in a fresh process too: a process that already ran other tests (vLLM imported,
    # kernels chosen, thread pools sized) need not round the same way bit for bit.
    rc, err = _train(config, tmp_path / "full")
    assert rc == 0, err[-3000:]
    out = tmp_path / "killed"
    for i, kill in enumerate(kills):
        rc, err = _train(config, out, kill=kill, resume=i > 0)
        assert rc == -signal.SIGKILL, f"kill point {kill} was not reached (exit {rc}):\n{err[-3000:]}"
        for ckpt in list_checkpoints(out / "checkpoints"):  # every published checkpoint is whole
            load_trainer_state(ckpt)
    _train(config, out, resume=True)

    weights, state = _final_state(out, steps)
    ref_weights, ref_state = _final_state(tmp_path / "full", steps)
    assert_equal_trees(weights, ref_weights, "model")
    for key in ("optimizer", "scheduler", "sampler", "step"):
        assert_equal_trees(state[key], ref_state[key], key)
    logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(1, steps + 1))  # no step lost or repeated
    leftovers = [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # the killed writers' temporary directories were cleaned up


def test_kill_at_three_points_then_resume_equals_the_uninterrupted_run(tmp_path, tiny_dir, monkeypatch):
    # generation of step 2; the 3rd optimizer update (step 2 of the resumed run); the step-4 checkpoint
    # half written (its trainer_state.pt cut short inside the temporary directory).
    _check_killed_run_matches(tmp_path, tiny_dir, monkeypatch, ["generate:2", "optimizer:3", "ckpt_write:2"])


@pytest.mark.slow  # 28 s; the three-point kill test above covers the same resume path in CI
def test_killed_twice_before_the_first_checkpoint_then_resumed_equals_the_uninterrupted_run(
    tmp_path, tiny_dir, monkeypatch
):
    # Step 1 logged, its checkpoint half written; then, resumed from step 0, step 1 again and its checkpoint
    # written but not yet published. A scheduler requeueing the job with --resume starts it over both times.
    _check_killed_run_matches(tmp_path, tiny_dir, monkeypatch, ["ckpt_write:1", "ckpt_rename:1"])


def test_resume_refuses_the_unsaved_progress_of_another_run(tmp_path, tiny_dir):
    config = _config(tmp_path, tiny_dir)
    out = tmp_path / "killed"
    rc, err = _train(config, out, kill="ckpt_write:1")
    assert rc == -signal.SIGKILL, err[-3000:]
    rc, err = _train(config, out, resume=True, overrides=["rollout.num_generations=2"], must_succeed=False)
    assert rc != 0 and "is not this run's unsaved progress: it is another run: rollout.num_generations" in err
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1]


@pytest.mark.slow
def test_kill_at_every_phase_then_resume_equals_the_uninterrupted_run(tmp_path, tiny_dir, monkeypatch):
    kills = [
        "generate:1",
        "score:3",
        "optimizer:1",
        "optimizer:4",
        "ckpt_write:1",
        "ckpt_rename:1",
        "generate:3",
        "score:2",
        "ckpt_rename:2",
        "optimizer:2",
        "ckpt_write:2",
        "ckpt_resave:1",
    ]
    _check_killed_run_matches(tmp_path, tiny_dir, monkeypatch, kills, steps=10)  # the kills never reach the end


def test_an_incomplete_checkpoint_directory_is_skipped_on_resume(tmp_path, tiny_dir, monkeypatch):
    config = _config(tmp_path, tiny_dir)
    out = tmp_path / "run"
    _train_in_process(config, out, monkeypatch, "run.max_steps=1")
    root = out / "checkpoints"
    # step-000002 and step-000003: copies of step 1 cut short, as a kill while copying or a writer without
    # the atomic rename leaves them (a truncated state file; no state file at all).
    for step, damage in ((2, "truncate"), (3, "remove")):
        broken = root / f"step-{step:06d}"
        shutil.copytree(root / "step-000001", broken)
        state = broken / TRAINER_STATE
        if damage == "truncate":
            state.write_bytes(state.read_bytes()[:100])
        else:
            state.unlink()
    damaged = {p.name: p.read_bytes() for p in (root / "step-000002").iterdir()}
    assert latest_checkpoint(root).name == "step-000001"
    assert [p.name for p in list_checkpoints(root)] == ["step-000001"]
    trainer = _train_in_process(config, out, monkeypatch, "run.max_steps=2", "run.resume=true")
    assert trainer.resumed_from == root / "step-000001" and trainer.step == 2
    assert [p.name for p in list_checkpoints(root)] == ["step-000001", "step-000002"]  # the broken one replaced
    (kept,) = root.glob("step-000002.incomplete-*")  # ... but not deleted: what a user saved is never lost
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == damaged


def test_async_run_killed_twice_resumes_and_leaves_no_engine_process(tmp_path, tiny_dir):
    """rollout.mode async: kill -9 of the trainer at an optimizer step and in scoring. Its engine process notices
    and exits; the resumed run logs every step exactly once, and every published checkpoint is whole."""
    cfg = yaml.safe_load(_config(tmp_path, tiny_dir).read_text())
    cfg["rollout"] = {"engine": "hf", "mode": "async", "num_generations": 4, "max_completion_length": 3}
    cfg["rollout"] |= {"partial": {"segment_tokens": 1}, "async_engine": {"threads": 1, "timeout_seconds": 120}}
    config = tmp_path / "async.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "killed"
    for i, kill in enumerate(["optimizer:2", "score:2"]):
        before = _spawned()
        rc, err = _train(config, out, kill=kill, resume=i > 0)
        assert rc == -signal.SIGKILL, f"kill point {kill} was not reached (exit {rc}):\n{err[-3000:]}"
        deadline = time.monotonic() + 15
        while _spawned() - before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _spawned() - before, "the engine process outlived its trainer"
        for ckpt in list_checkpoints(out / "checkpoints"):
            load_trainer_state(ckpt)
    _train(config, out, resume=True)
    logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(1, STEPS + 1))


def _spawned() -> set[int]:
    """The live processes started by multiprocessing's spawn (the engine process is one)."""
    pids = set()
    for proc in Path("/proc").iterdir():
        try:
            if (
                b"spawn_main" in (proc / "cmdline").read_bytes()
                and (proc / "stat").read_text().split(")")[-1].split()[0] != "Z"
            ):
                pids.add(int(proc.name))
        except (OSError, ValueError):
            continue
    return pids

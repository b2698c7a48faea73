"""kill -9 in the middle of a multi-turn step (inside a tool call, between two turns), then `--resume`: the
resumed run logs every step once and ends with the weights and optimizer state of an uninterrupted run, bit for
bit (`grpo-fast train` subprocesses, the tool agent of tool_agent.py, one thread, the transformers engine)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from grpo_fast.core.checkpoint import latest_checkpoint, load_trainer_state
from grpo_fast.testing.configs import quiet_run_config
from grpo_fast.testing.train_cli import train_in_subprocess
from grpo_fast.testing.trees import assert_equal_trees

HERE = Path(__file__).parent
STEPS = 3
TOOLS = ["tool_agent:killing_multiply", "tool_agent:lookup", "tool_agent:explode", "tool_agent:slow"]


def _config(tmp_path: Path, agent_dir: Path) -> Path:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in (("m", "408"), ("a", "v"))))
    cfg = quiet_run_config(
        agent_dir,
        reward={"funcs": ["exact_match"], "workers": 0},
        rollout={
            "engine": "hf",
            "tools": TOOLS,
            "num_generations": 2,
            "max_completion_length": 160,
            "max_model_len": 256,
            "tool_timeout_seconds": 0.5,
        },
        optim={"lr": 1e-2},
        run={"max_steps": STEPS, "prompts_per_step": 2, "micro_batch_size": 4},
    )
    cfg["data"] = {"source": str(data)}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(config: Path, out: Path, kill: str | None = None, resume: bool = False) -> subprocess.CompletedProcess:
    return train_in_subprocess(config, out, import_dir=HERE, kill=kill, resume=resume)


@pytest.mark.slow  # three training subprocesses (~25 s): CI stays under its 20 minutes; `scripts/test.sh -m slow`
def test_killed_inside_a_tool_call_then_resumed_equals_the_uninterrupted_run(tmp_path, tool_agent):
    config = _config(tmp_path, tool_agent[2])
    full = _train(config, tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]
    out = tmp_path / "killed"
    killed = _train(config, out, kill="tool:3")  # the first multiply call of step 2 (two per step)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert latest_checkpoint(out / "checkpoints").name == "step-000001"
    resumed = _train(config, out, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged] == list(range(1, STEPS + 1))  # no step lost or repeated
    assert all(m["tools/calls_per_rollout"] > 0 for m in logged)
    last, ref = latest_checkpoint(out / "checkpoints"), latest_checkpoint(tmp_path / "full" / "checkpoints")
    assert last.name == ref.name == f"step-{STEPS:06d}"
    assert_equal_trees(load_file(last / "model.safetensors"), load_file(ref / "model.safetensors"), "model")
    state, ref_state = load_trainer_state(last), load_trainer_state(ref)
    for key in ("optimizer", "sampler", "step"):
        assert_equal_trees(state[key], ref_state[key], key)

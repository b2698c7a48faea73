"""Configs of whole training runs for tests: a tiny task, no evaluation, no trackers, progress bars or plots, a
checkpoint every step, so that each test states only the sections it is about."""

from __future__ import annotations

from pathlib import Path


def quiet_run_config(model_dir: str | Path, *, run: dict | None = None, **sections: dict) -> dict:
    """The config tree (a dict, as its YAML loads) of a run of `model_dir` on 16 modular-arithmetic prompts:
    `sections` (reward, rollout, grpo, optim, loss, ...) are whole sections; `run`'s keys go into the quiet
    `run` section."""
    return {
        "model": {"path": str(model_dir)},
        "data": {"source": "task:modular_arithmetic", "task_kwargs": {"n": 16, "seed": 0}, "use_chat_template": False},
        **sections,
        "run": {"eval_every": 0, "save_every": 1, "report_to": [], "progress": False, "plots": False, **(run or {})},
        "health": {"audit_every": 0},
    }
